"""Host time of small GAE calls, side by side across source trees.

Each tree (a checkout of gaescan, e.g. a ``git worktree`` of another commit)
runs in its own process, pinned to one core where ``taskset`` exists, and the
trees alternate round after round, so that a busy spell of a shared machine
falls on all of them.  Each process times ``gaescan.gae`` on float32
``[8, T]`` with dones (validation included, outputs allocated by the call):
61 blocks of 300 calls after a warm-up, reporting the median and the 10th
percentile of the per-call block means, in microseconds.

    python benchmarks/small_call.py /path/to/other/tree . --rounds 4

Prints the machine, then one line per tree and round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import gaescan
out = {}
for T in map(int, sys.argv[2].split(",")):
    rng = np.random.default_rng(0)
    r = rng.standard_normal((8, T)).astype(np.float32)
    v = rng.standard_normal((8, T)).astype(np.float32)
    d = rng.random((8, T)) < 0.01
    for _ in range(2000):
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    blocks = []
    for _ in range(61):
        t0 = time.perf_counter_ns()
        for _ in range(300):
            gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
        blocks.append((time.perf_counter_ns() - t0) / 300 / 1e3)
    blocks.sort()
    out[T] = [round(blocks[30], 2), round(blocks[6], 2)]
print(json.dumps(out))
"""


def _cpu_model() -> str:
    """The CPU's model name, with its family and model numbers where Linux reports them."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="source trees (directories holding the gaescan package)")
    ap.add_argument("--lengths", default="16,1024", help="comma-separated T values (default 16,1024)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--core", type=int, default=1, help="the core to pin to (with taskset)")
    args = ap.parse_args()
    pin = ["taskset", "-c", str(args.core)] if shutil.which("taskset") else []
    print("# small calls: gaescan.gae f32 [8, T] with dones, validation included, microseconds per call: "
          "[median, 10th percentile] of 61 blocks of 300 calls")
    print(f"# each tree in its own process{', pinned to core ' + str(args.core) if pin else ''}, alternating "
          f"({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)")
    print(f"# machine: {_cpu_model()}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}")
    for k in range(args.rounds):
        for tree in args.trees:
            res = subprocess.run([*pin, sys.executable, "-c", _CHILD, os.path.abspath(tree), args.lengths],
                                 capture_output=True, text=True, check=True)
            print(f"round {k + 1} {tree} {json.dumps(json.loads(res.stdout))}", flush=True)


if __name__ == "__main__":
    main()
