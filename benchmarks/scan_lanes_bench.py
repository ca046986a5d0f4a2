"""Batch-major float32 ``discounted_returns`` and ``linear_scan`` with eight rows in SIMD lanes (the default) against rows in pairs.

Run: ``python benchmarks/scan_lanes_bench.py [--repeat N] [--rounds N]``.

On float32 ``[256, 131072]`` rows contiguous along time, both functions run
eight rows per SIMD vector (:func:`gaescan.kernels.cpu.returns_lanes`,
:func:`gaescan.kernels.cpu.scan_lanes`; the choice is
:func:`gaescan.backends.numba_cpu._scan_lanes_ok`).  The same process times
the pair kernels they replace (``returns_rows_fused``, ``scan_rows``: the
same call with that choice answering no) on the same inputs into the same
outputs, the two calls in turn (medians of each), and a STREAM triad over
the same element count, round after round.  Before timing it checks that
both give the same bits.  Figures are per machine: commit the output under
``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gaescan
from gaescan.backends import numba_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402
from lanes_bench import ab_args, ab_rounds  # noqa: E402


def main(argv=None) -> None:
    args = ab_args(__doc__, argv)
    R, T = 256, 131072
    rng = np.random.default_rng(0)
    r = rng.standard_normal((R, T), dtype=np.float32)
    a = rng.uniform(0.9, 1.0, (R, T)).astype(np.float32)
    d = rng.random((R, T)) < 0.01
    out = np.empty_like(r)
    cases = {
        # name: (call, bytes per step)
        "returns dones": (lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, out=out), 9),
        "returns plain": (lambda: gaescan.discounted_returns(r, gamma=0.99, out=out), 8),
        "scan reverse": (lambda: gaescan.linear_scan(a, r, reverse=True, out=out), 12),
        "scan forward": (lambda: gaescan.linear_scan(a, r, out=out), 12),
    }
    choice = numba_cpu._scan_lanes_ok

    def pairs(call):
        def run():
            numba_cpu._scan_lanes_ok = lambda *_: False
            try:
                call()
            finally:
                numba_cpu._scan_lanes_ok = choice
        return run

    print(f"# python benchmarks/scan_lanes_bench.py --repeat {args.repeat} --rounds {args.rounds}")
    print(f"# {machine()}")
    print(f"# [{R}, {T}] float32, gamma=0.99, a ~ U(0.9, 1) per step; medians of {args.repeat}, "
          "the two kernels timed in turn; x triad = bytes one pass moves (column 'B' per step) / time / "
          "triad GB/s of the same round")
    for name, (call, _) in cases.items():
        pairs(call)()
        want = out.copy()
        call()
        if not np.array_equal(want.view(np.uint32), out.view(np.uint32)):
            raise SystemExit(f"{name}: lanes and pairs give different bits")
    print("# lanes and pairs: the same bits in every case")
    ab_rounds(args, R * T, cases, pairs, ("pairs", "lanes"))


if __name__ == "__main__":
    main()
