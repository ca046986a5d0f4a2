"""CPU benchmark of :func:`gaescan.vtrace` against the memory limit.

Run: ``python benchmarks/vtrace_bench.py [--repeat N] [--B B] [--T T]``.

Prints medians beside a Numba ``prange`` STREAM triad over the same element
count, measured in the same run (see ``benchmarks/cpu_bench.py``).  V-trace
with dones moves 21 bytes per float32 step: rewards, values and log-ratios
read (4 each), the done flag read (1), ``vs`` and the advantages written
(4 each).  ``× triad`` is that effective bandwidth over the triad's.  GAE
with dones (17 bytes per step) runs on the same inputs for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from cpu_bench import Table, _median, _triad_bw, machine  # noqa: E402

import gaescan  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--numpy", action="store_true", help="also time backend='numpy' (slow)")
    args = ap.parse_args(argv)
    B, T, rep = args.B, args.T, args.repeat
    N = B * T
    rng = np.random.default_rng(0)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    lr = rng.standard_normal((B, T), dtype=np.float32) * np.float32(0.5)
    d = rng.random((B, T), dtype=np.float32) < 1e-3
    vs, adv = np.empty_like(r), np.empty_like(r)
    tab = Table()
    bw = _triad_bw(N, rep)
    tab.add(f"STREAM triad, {N} elements (f32)", 12 * N / bw / 1e9, 12, N, bw)
    t = _median(lambda: gaescan.vtrace(r, v, lr, gamma=0.99, lam=1.0, dones=d, out=(vs, adv)), rep)
    tab.add(f"vtrace dones [{B}, {T}] f32", t, 21, N, bw, "target >= 0.70x")
    t = _median(lambda: gaescan.vtrace(r, v, lr, gamma=0.99, lam=0.95, c_bar=0.9, dones=d, out=(vs, adv)), rep)
    tab.add(f"vtrace dones, lam=0.95, c_bar=0.9 [{B}, {T}] f32", t, 21, N, bw)
    t = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(vs, adv)), rep)
    tab.add(f"gae dones [{B}, {T}] f32 (for comparison)", t, 17, N, bw)
    rt, vt, lrt, dt = (np.ascontiguousarray(x.T) for x in (r, v, lr, d))
    vs = adv = None
    vst, advt = np.empty_like(rt), np.empty_like(rt)
    t = _median(lambda: gaescan.vtrace(rt, vt, lrt, gamma=0.99, dones=dt, axis=0, out=(vst, advt)), rep)
    tab.add(f"vtrace dones, time-major [{T}, {B}] axis=0 f32", t, 21, N, bw)
    if args.numpy:
        t = _median(lambda: gaescan.vtrace(r, v, lr, gamma=0.99, dones=d, backend="numpy"), max(1, rep // 3))
        tab.add(f"vtrace dones [{B}, {T}] f32, backend='numpy'", t, 21, N, bw)
    print(machine())
    tab.print()


if __name__ == "__main__":
    main()
