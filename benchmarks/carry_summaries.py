"""Time of the carry API's slice summaries, side by side across source trees.

Each tree (a checkout of gaescan, e.g. a ``git worktree`` of another commit)
runs in its own process with its own Numba cache directory, and the trees
alternate round after round, so that a busy spell of a shared machine falls on
all of them.  Each process times, on float32 ``[64, 65536]`` with dones,
``vtrace_summary``, ``gae_summary`` with a per-step γ and ``gae_summary`` with
scalars: the median of 7 calls after a warm-up, in milliseconds.

    python benchmarks/carry_summaries.py /path/to/other/tree . --rounds 3

Prints the machine, then one line per tree, round and case.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import gaescan
assert gaescan.__file__.startswith(sys.argv[1]), gaescan.__file__
rng = np.random.default_rng(0)
R, T = 64, 65536
r = rng.standard_normal((R, T)).astype(np.float32)
v = rng.standard_normal((R, T)).astype(np.float32)
lr = (0.3 * rng.standard_normal((R, T))).astype(np.float32)
g = rng.uniform(0.9, 1.0, (R, T)).astype(np.float32)
d = rng.random((R, T)) < 0.001
cases = {
    "vtrace_summary, dones": lambda: gaescan.vtrace_summary(r, v, lr, gamma=0.99, dones=d),
    "gae_summary, per-step gamma": lambda: gaescan.gae_summary(r, v, gamma=g, lam=0.95, dones=d),
    "gae_summary, scalars": lambda: gaescan.gae_summary(r, v, gamma=0.99, lam=0.95, dones=d),
}
for name, f in cases.items():
    f()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    print(f"{name:30s} {np.median(ts) * 1e3:9.2f} ms")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="source trees (each holding a gaescan/ package)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} CPUs")
    caches = {tree: tempfile.mkdtemp(prefix="gaescan-numba-") for tree in args.trees}
    for k in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, NUMBA_CACHE_DIR=caches[tree])
            out = subprocess.run([sys.executable, "-c", _CHILD, os.path.abspath(tree)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                print(f"round {k + 1}  {tree:24s} {line}")


if __name__ == "__main__":
    main()
