"""No reference counting inside the step loops of the fused CPU kernels.

Numba increments and decrements an array's reference count (two calls into
its runtime, each an atomic operation) around a use of the array that it
cannot prove balanced within one basic block: for instance an array read
behind a short-circuit ``and`` / ``or`` in an inlined helper
(:func:`gaescan.kernels.cpu._flag_at` says how the kernels avoid it).  Inside
a step loop those calls cost more than the step itself: with them the
masked and the ``next_values`` steps of the pair kernels take several times
as long (``benchmarks/results/*-refcount-calls.txt``).

The check compiles builds afresh in a subprocess (Numba's disk cache keeps no
IR to inspect) and reads their optimised LLVM IR: every loop that holds a
call to ``NRT_incref`` or ``NRT_decref`` must be long, an outer loop over
rows, pairs, tiles or blocks, not a loop over steps.  Step loops are a few
dozen IR instructions; the outer loops are hundreds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

# The loops over steps are 40 to 110 IR lines in these kernels; the loops
# around them are over 150.
STEP_LOOP_MAX_LINES = 150

# (kernel, dtype): the batch-major pair kernels of GAE (every case: plain,
# terminations, masks, next values), returns and scans; the SIMD-lanes
# kernels, whose rows' ends run one step at a time; the time-major kernels
# with next values and the returns one; V-trace's fused kernel.  The general
# kernels (``gae_rows``, ``returns_rows``, ``gae_tm``, ``returns_tm``) keep
# such calls on their masked-step path, which returns early: written without
# it they are no faster (``…-refcount-calls.txt``).
BUILDS = [("gae_rows_fused_1t", "float32"), ("gae_rows_fused_1t", "float64"),
          ("returns_rows_fused_1t", "float64"), ("scan_rows", "float64"),
          ("gae_lanes", "float32"), ("returns_lanes", "float32"), ("vtrace_lanes", "float32"),
          ("gae_timemajor_next", "float64"), ("returns_timemajor_lanes", "float32"),
          ("vtrace_fused", "float64")]


def _blocks(fn: str) -> tuple[list[str], dict[str, list[str]]]:
    """The basic blocks of one function's text, in order, and their lines
    (an unlabelled first block is named ``entry``)."""
    order: list[str] = []
    body: dict[str, list[str]] = {}
    cur = None
    for line in fn.splitlines()[1:]:
        m = re.match(r'^"?([\w.$-]+)"?:', line)
        if m or cur is None:
            cur = m.group(1) if m else "entry"
            order.append(cur)
            body[cur] = []
        if not m and line.strip() and line.strip() != "}":
            body[cur].append(line.strip())
    return order, body


def refcounts_in_loops(ir: str) -> tuple[int, list[int]]:
    """The number of natural loops in ``ir`` (a module's text), and the size
    (IR lines) of the smallest loop around each block that calls
    ``NRT_incref`` or ``NRT_decref``."""
    sizes = []
    nloops = 0
    for fn in re.findall(r"^define .*?^\}", ir, re.S | re.M):
        order, body = _blocks(fn)
        succ = {b: [t for x in body[b] if x.startswith(("br ", "switch "))
                    for t in re.findall(r'label %"?([\w.$-]+)"?', x)] for b in order}
        pred: dict[str, list[str]] = {b: [] for b in order}
        for b in order:
            for s in succ[b]:
                pred[s].append(b)
        dom = {b: set(order) for b in order}
        dom[order[0]] = {order[0]}
        changed = True
        while changed:
            changed = False
            for b in order[1:]:
                new = set.intersection(*(dom[p] for p in pred[b])) | {b} if pred[b] else {b}
                if new != dom[b]:
                    dom[b], changed = new, True
        loops = []
        for b in order:
            for h in succ[b]:
                if h in dom[b]:  # a back edge: the loop of header h
                    loop, stack = {h, b}, [b]
                    while stack:
                        x = stack.pop()
                        if x != h:
                            for p in pred[x]:
                                if p not in loop:
                                    loop.add(p)
                                    stack.append(p)
                    loops.append(loop)
        nloops += len(loops)
        for b in order:
            if any("@NRT_incref" in x or "@NRT_decref" in x for x in body[b]):
                around = [sum(len(body[x]) for x in loop) for loop in loops if b in loop]
                if around:
                    sizes.append(min(around))
    return nloops, sizes


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from gaescan.kernels import cpu
    out = {}
    for name, dtype in json.loads(sys.argv[1]):
        k = next(k for k in cpu.all_kernels() if k.__name__ == name)
        build = k.compile(np.dtype(dtype), serial=k.parallel)
        out[f"{name}[{dtype}]"] = "\\n".join(build.inspect_llvm().values())
    json.dump(out, sys.stdout)
""")


def test_no_reference_counting_in_step_loops(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(BUILDS)], env=env,
                         capture_output=True, text=True, check=True)
    irs = json.loads(run.stdout)
    assert set(irs) == {f"{n}[{d}]" for n, d in BUILDS}
    for build, ir in irs.items():
        nloops, sizes = refcounts_in_loops(ir)
        assert nloops >= 4, f"{build}: {nloops} loops found; the check reads nothing"
        small = [n for n in sizes if n < STEP_LOOP_MAX_LINES]
        assert not small, (f"{build}: reference counting inside loops of {sorted(set(small))} IR lines "
                           "(a step loop): an array used behind a branch?")


def test_the_check_sees_a_call_in_a_loop():
    """The analysis on a hand-written function: a call in a loop of 5 lines,
    another after the loop."""
    ir = textwrap.dedent("""
        define void @f(ptr %a) {
        entry:
          br label %loop
        loop:
          %i = phi i64 [ 0, %entry ], [ %n, %loop ]
          call void @NRT_incref(ptr %a)
          %n = add i64 %i, 1
          %c = icmp ult i64 %n, 8
          br i1 %c, label %loop, label %exit
        exit:
          call void @NRT_decref(ptr %a)
          ret void
        }
    """)
    assert refcounts_in_loops(ir) == (1, [5])
    # LLVM leaves the first block unlabelled: its lines still count.
    assert _blocks("define void @g() {\n  %a = add i64 1, 2\n  br label %x\nx:\n  ret void\n}") == (
        ["entry", "x"], {"entry": ["%a = add i64 1, 2", "br label %x"], "x": ["ret void"]})
