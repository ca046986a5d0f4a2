"""The fused discounted-returns kernels against the general one, in one process.

Run: ``python benchmarks/returns_kernels.py [--repeat N]``.

``discounted_returns`` with scalar or per-row γ and no mask or packing takes
the fused kernels (:func:`gaescan.kernels.cpu.returns_rows_fused`); every
other call takes the general kernel (``returns_rows``), which reads a
broadcast γ and a mask at every step.  This script times both on the same
``[256, 131072]`` inputs, alternating calls, and prints the medians beside a
STREAM triad of the same run (``× triad`` counts 9 bytes per step in float32
with dones: reward and done read, return written).  The first line names the
machine: results are per machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

import numpy as np

import gaescan
import gaescan.testing
from gaescan.backends import numba_cpu as nc
from gaescan.kernels import cpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_bench  # noqa: E402  (the triad and the machine line)


def _case(r: np.ndarray, dones: np.ndarray | None, repeat: int) -> str:
    """One case: both kernels on the same inputs, alternating, beside the triad."""
    dt = r.dtype
    B, T = r.shape
    fused_out, general_out = np.empty_like(r), np.empty_like(r)
    rows = SimpleNamespace(R=B, T=T, dtype=dt, nseg=B)
    last = np.zeros(B, dt)
    narrow = nc._narrow(rows, 0.99)

    def fused():
        gaescan.discounted_returns(r, gamma=0.99, dones=dones, out=fused_out)

    def general():
        nc._run(cpu.returns_rows, narrow)(
            r, nc._coeff(0.99, rows), nc._flag(dones, rows, False), nc._flag(None, rows, True), last,
            nc._NO_OFFSETS, False, dt.type(0), general_out)

    fused()
    general()
    gaescan.testing.assert_close(fused_out, general_out)
    tf, tg = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        fused()
        tf.append(time.perf_counter() - t)
        t = time.perf_counter()
        general()
        tg.append(time.perf_counter() - t)
    bw = cpu_bench._triad_bw(B * T, 5, dt.type)
    nbytes = (2 * dt.itemsize + (dones is not None)) * B * T
    f, g = float(np.median(tf)), float(np.median(tg))
    case = f"{dt.name} {'dones' if dones is not None else 'plain'} [{B}, {T}]"
    return (f"{case:<28s} fused {f * 1e3:7.1f} ms ({nbytes / f / 1e9 / bw:.2f}x triad)   "
            f"general {g * 1e3:7.1f} ms ({nbytes / g / 1e9 / bw:.2f}x)   general/fused {g / f:.2f}   "
            f"triad {bw:.1f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=11)
    args = ap.parse_args()
    print(f"# machine: {cpu_bench.machine()}")
    print(f"# medians of {args.repeat} alternating calls; x triad = GB/s over the triad's GB/s, same run")
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        r = rng.standard_normal((256, 131072)).astype(dt)
        d = rng.random(r.shape) < 0.01
        for dones in (d, None):
            print(_case(r, dones, args.repeat))


if __name__ == "__main__":
    main()
