"""Time-major GAE: the vectorised loop beside the eight-columns-in-lanes kernel.

Run: ``python benchmarks/time_major_bench.py [--rounds N] [--repeat N] [--T T] [--B B]``.

``gaescan.gae``, ``gaescan.discounted_returns`` and ``gaescan.linear_scan``
with ``axis=0`` on float32 ``[T, B]`` arrays (C-contiguous, so time-major
rows), into preallocated outputs: GAE with terminations, without, and with
next values, terminations and truncations; returns with dones; scans with a
per-step coefficient, both ways.
Where the outputs allow non-temporal stores, the backend runs the
eight-columns-in-lanes kernels (``gae_timemajor_lanes``,
``returns_timemajor_lanes``, ``scan_timemajor_lanes``: "lanes"); this script
also runs the vectorised loops they replace (``gae_timemajor``,
``gae_timemajor_next``, ``returns_tm``, ``scan_tm``: "loop") on the same call
by reporting the outputs as unfit for streaming.  The two alternate call after call (medians),
each round after a triad timed on the same element count; the bits of both are
checked equal first.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from cpu_bench import _triad_bw, machine  # noqa: E402

import gaescan  # noqa: E402
from gaescan.backends import numba_cpu  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--B", type=int, default=4096)
    args = ap.parse_args(argv)
    T, B = args.T, args.B
    rng = np.random.default_rng(0)
    r = rng.standard_normal((T, B), dtype=np.float32)
    v = rng.standard_normal((T, B), dtype=np.float32)
    d = rng.random((T, B)) < 1e-3
    nv = rng.standard_normal((T, B), dtype=np.float32)
    tr = rng.random((T, B)) < 1e-3
    a = rng.uniform(0.9, 1.0, (T, B)).astype(np.float32)
    gae = dict(gamma=0.99, lam=0.95, axis=0)
    cases = {
        "gae dones": (17, lambda: gaescan.gae(r, v, dones=d, out=(adv, ret), **gae)),
        "gae plain": (16, lambda: gaescan.gae(r, v, out=(adv, ret), **gae)),
        "gae next": (22, lambda: gaescan.gae(r, v, next_values=nv, terminated=d, truncated=tr, out=(adv, ret), **gae)),
        "returns dones": (9, lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, axis=0, out=adv)),
        "scan reverse": (12, lambda: gaescan.linear_scan(a, r, reverse=True, axis=0, out=adv)),
        "scan forward": (12, lambda: gaescan.linear_scan(a, r, axis=0, out=adv)),
    }
    adv, ret = np.empty_like(r), np.empty_like(r)
    lanes = numba_cpu._stream_cols
    forms = {"loop": lambda a, b: (0, False), "lanes": lanes}
    if not lanes(adv.T, ret.T)[1]:
        sys.exit("these outputs do not allow non-temporal stores: nothing to compare")
    print(f"# python benchmarks/time_major_bench.py, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {machine()}")
    print(f"# float32 [T, B] = [{T}, {B}], axis=0, out= preallocated; the two kernels in turn, "
          f"medians of {args.repeat}; x triad = bytes per step (read and written) / time / triad GB/s")
    try:
        for rnd in range(args.rounds):
            bw = _triad_bw(T * B, args.repeat)
            for case, (per, call) in cases.items():
                outs = {}
                for name, form in forms.items():
                    numba_cpu._stream_cols = form
                    res = call()
                    outs[name] = [x.copy() for x in (res if isinstance(res, tuple) else (res,))]
                same = all(np.array_equal(x.view(np.uint32), y.view(np.uint32))
                           for x, y in zip(*outs.values(), strict=True))
                times = {name: [] for name in forms}
                for _ in range(args.repeat):
                    for name, form in forms.items():
                        numba_cpu._stream_cols = form
                        t0 = time.perf_counter()
                        call()
                        times[name].append(time.perf_counter() - t0)
                med = {name: float(np.median(t)) for name, t in times.items()}
                cells = "  ".join(f"{name} {t * 1e3:6.1f} ms ({per * T * B / t / 1e9 / bw:.2f}x triad)"
                                  for name, t in med.items())
                print(f"round {rnd + 1} triad {bw:5.1f} GB/s {case}: {cells}  "
                      f"ratio {med['loop'] / med['lanes']:.2f}  "
                      f"bits {'equal' if same else 'DIFFER'}", flush=True)
    finally:
        numba_cpu._stream_cols = lanes


if __name__ == "__main__":
    main()
