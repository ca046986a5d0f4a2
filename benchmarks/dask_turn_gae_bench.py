"""turn_gae on Dask arrays against gae on the same Dask blocks and both in memory.

Run: ``python benchmarks/dask_turn_gae_bench.py [--repeat 7]``.

``[16, 65536]`` float32 conversations of 64 turns, 30 % of the tokens masked,
chunks ``(8, 16384)``, Dask's threaded scheduler on this machine's cores.
Each round times every case once, in turn; medians (and minima) over the
rounds, each as a ratio to the Dask ``gae`` call with the same mask.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import dask
import dask.array as da
import numpy as np

import gaescan


def _machine() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    keep = [" ".join(line.split()) for line in out if line.startswith(("Model name", "Model:", "CPU(s)"))]
    return "; ".join(keep)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    B, T, chunks = 16, 65536, (8, 16384)
    r, v = rng.standard_normal((2, B, T)).astype(np.float32)
    ids = np.sort(rng.integers(0, 64, (B, T)), axis=1)
    mask = rng.random((B, T)) < 0.7
    R, V, ID, M = (da.from_array(x, chunks=chunks) for x in (r, v, ids, mask))
    kw = dict(gamma=0.99, lam=0.95)
    cases = {
        "dask gae (mask)": lambda: dask.compute(*gaescan.gae(R, V, mask=M, **kw)),
        "dask turn_gae (mask)": lambda: dask.compute(*gaescan.turn_gae(R, V, ID, mask=M, **kw)),
        "dask turn_gae (no mask)": lambda: dask.compute(*gaescan.turn_gae(R, V, ID, **kw)),
        "in-memory turn_gae (mask)": lambda: gaescan.turn_gae(r, v, ids, mask=mask, **kw),
        "in-memory gae (mask)": lambda: gaescan.gae(r, v, mask=mask, **kw),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    with dask.config.set(scheduler="threads"):
        for f in cases.values():
            f()  # compile and warm
        for _ in range(args.repeat):
            for name, f in cases.items():
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
    print("machine:", _machine())
    print(f"[{B}, {T}] float32, chunks {chunks}, 64 turns per row, 30% of tokens masked, "
          f"threaded scheduler, {args.repeat} rounds")
    base = statistics.median(times["dask gae (mask)"])
    for name, xs in times.items():
        m = statistics.median(xs)
        print(f"{name:28s} median {m * 1e3:8.1f} ms  (min {min(xs) * 1e3:7.1f})  x dask gae: {m / base:5.2f}")


if __name__ == "__main__":
    main()
