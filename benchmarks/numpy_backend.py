"""Issue-2 benchmark: the ``"numpy"`` chunk-scan backend vs the serial loop.

Prints medians of several runs, measured side by side in one process, and the
ratios.  Usage: ``python benchmarks/numpy_backend.py [--B 256] [--T 131072]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import gaescan
from gaescan.bench.baselines import chunk_scan_gae, serial_gae


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up (JIT, page faults)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    B, T = args.B, args.T
    rng = np.random.default_rng(0)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    d = rng.random((B, T)) < 1e-3
    g, lam = 0.99, 0.95
    rows = [
        ("serial loop (no dones)", lambda: serial_gae(np, r, v, g, lam), 1),
        ("serial loop (dones)", lambda: serial_gae(np, r, v, g, lam, d), 1),
        ("published chunk-scan C=256 (no dones)", lambda: chunk_scan_gae(np, r, v, g, lam, 256), args.repeat),
        ("gaescan numpy (no dones)", lambda: gaescan.gae(r, v, gamma=g, lam=lam, backend="numpy"), args.repeat),
        ("gaescan numpy (dones)", lambda: gaescan.gae(r, v, gamma=g, lam=lam, dones=d, backend="numpy"), args.repeat),
        ("gaescan numba (no dones)", lambda: gaescan.gae(r, v, gamma=g, lam=lam, backend="numba"), args.repeat),
        ("gaescan numba (dones)", lambda: gaescan.gae(r, v, gamma=g, lam=lam, dones=d, backend="numba"), args.repeat),
    ]
    print(f"GAE float32, B={B}, T={T}; medians")
    times = {}
    for name, fn, rep in rows:
        times[name] = median_time(fn, max(1, rep))
    base = {"no dones": times["serial loop (no dones)"], "dones": times["serial loop (dones)"]}
    print(f"{'method':42s} {'median s':>10s} {'vs serial':>10s}")
    for name, t in times.items():
        key = "dones" if "(dones)" in name else "no dones"
        print(f"{name:42s} {t:10.4f} {base[key] / t:9.1f}x")


if __name__ == "__main__":
    main()
