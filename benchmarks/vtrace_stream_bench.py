"""Batch-major float32 V-trace lanes blocks aligned to the outputs' lines and streamed, against the blocks anchored at the row's end.

Run: ``python benchmarks/vtrace_stream_bench.py [--repeat N] [--rounds N]``.

``gaescan.vtrace`` on float32 ``[256, 131072]`` rows (plain, with dones, and
with ``next_values`` and both flags) runs
:func:`gaescan.kernels.cpu_vtrace.vtrace_lanes` (or ``vtrace_lanes_next``)
with its blocks starting at the first step of each row that begins a 64-byte
line of the outputs (``phase``), writing both outputs by non-temporal stores
(``stream``, :func:`gaescan.backends.numba_cpu._stream`).  The same process
times, on the same inputs into the same outputs, the kernel called with
``phase = 0`` and ordinary stores (the blocks anchored at the row's end), and
with ``phase`` but ordinary stores: each against the default in turn, call
after call (medians), with a STREAM triad over the same element count per
round.  NumPy's large allocations start 16 bytes past a 64-byte line, so
without ``phase`` half of each block's 32-byte loads and stores straddle two
lines.  Figures are per machine: commit the output under
``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gaescan
from gaescan.backends.numba_cpu import _stream
from gaescan.kernels import cpu_vtrace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402
from lanes_bench import ab_args, ab_rounds  # noqa: E402
from vtrace_lanes_bench import inputs  # noqa: E402

GAMMA = 0.99


def main(argv=None) -> None:
    args = ab_args(__doc__, argv)
    R, T = 256, 131072
    rng, r, v, lr, d = inputs(R, T)
    nv = rng.standard_normal((R, T), dtype=np.float32)
    tr = rng.random((R, T)) < 0.005
    d8, tr8 = d.view(np.uint8), tr.view(np.uint8)
    vs, adv = np.empty_like(r), np.empty_like(r)
    gcol, lcol = np.full(R, GAMMA, np.float32), np.ones(R, np.float32)
    zero = np.zeros(R, np.float32)
    phase, stream = _stream(vs, adv)
    if not stream:
        raise SystemExit("the outputs do not stream here (STREAM_MIN_BYTES or their alignment)")

    def kernel(kind, ph, st):
        if kind == "next":
            return lambda: cpu_vtrace.vtrace_lanes_next(r, v, lr, nv, d8, tr8, gcol, lcol, zero, 1.0, 1.0, 1.0,
                                                        True, ph, st, vs, adv)
        has = kind == "dones"
        return lambda: cpu_vtrace.vtrace_lanes(r, v, lr, d8 if has else d8[:1, :1], has, gcol, lcol, zero, zero,
                                               1.0, 1.0, 1.0, True, ph, st, vs, adv)

    calls = {
        "dones": lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, dones=d, out=(vs, adv)),
        "plain": lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, out=(vs, adv)),
        "next_values": lambda: gaescan.vtrace(r, v, lr, gamma=GAMMA, next_values=nv, terminated=d, truncated=tr,
                                              out=(vs, adv)),
    }
    kinds = {"dones": "dones", "plain": "plain", "next_values": "next"}
    per_step = {"dones": 21, "plain": 20, "next_values": 26}
    # Each default call and its kernel call with the default's arguments give the same bits.
    for name, call in calls.items():
        call()
        a = (vs.copy(), adv.copy())
        kernel(kinds[name], phase, True)()
        if not (np.array_equal(a[0], vs) and np.array_equal(a[1], adv)):
            raise SystemExit(f"{name}: gaescan.vtrace and the direct kernel call differ")
    cases = {name: (call, per_step[name]) for name, call in calls.items()}
    by_call = {id(call): kinds[name] for name, call in calls.items()}
    print(f"# python benchmarks/vtrace_stream_bench.py --repeat {args.repeat} --rounds {args.rounds}")
    print(f"# {machine()}")
    print(f"# [{R}, {T}] float32, gamma={GAMMA}, state32; outputs start {vs.ctypes.data % 64} bytes past a "
          f"64-byte line, phase {phase}; medians of {args.repeat}, in turn")
    print("# default: blocks from step `phase`, non-temporal stores; end: blocks anchored at the row's end "
          "(phase 0), ordinary stores")
    ab_rounds(args, R * T, cases, lambda call: kernel(by_call[id(call)], 0, False), ("end", "default"))
    print("# aligned: blocks from step `phase`, ordinary stores")
    ab_rounds(args, R * T, cases, lambda call: kernel(by_call[id(call)], phase, False), ("aligned", "default"))


if __name__ == "__main__":
    main()
