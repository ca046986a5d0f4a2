"""Batch-major float32 V-trace with eight rows in SIMD lanes (the default) against rows in pairs.

Run: ``python benchmarks/vtrace_lanes_bench.py [--repeat N] [--rounds N]``.

``gaescan.vtrace`` on float32 ``[256, 131072]`` rows, plain and with dones,
runs :func:`gaescan.kernels.cpu_vtrace.vtrace_lanes` (eight rows per SIMD
register, see :mod:`gaescan.kernels._lanes`).  The same process times the
kernel it replaces, :func:`gaescan.kernels.cpu_vtrace.vtrace_fused` (two rows
per loop), on the same inputs into the same preallocated outputs, the two
calls in turn (medians of each), and a STREAM triad over the same element
count, round after round.  A second table does the same for time-major
``[131072, 256]`` (``axis=0``): the default,
:func:`gaescan.kernels.cpu_vtrace.vtrace_timemajor_lanes`, against the kernel
that sweeps the batch at each step, :func:`~gaescan.kernels.cpu_vtrace.vtrace_timemajor`.
Before timing, the script checks that the two
agree within 1e-6 relative L2 (the lanes kernel's exponential differs from the
pair kernel's by at most 5e-9 relative) and prints the difference.  Figures are
per machine: commit the output under ``benchmarks/results/`` with the CPU model
in the file name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gaescan
from gaescan.kernels import cpu_vtrace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import _triad_bw, machine  # noqa: E402
from lanes_bench import _alternating, ab_args  # noqa: E402

GAMMA, RHO_BAR, C_BAR = 0.99, 1.0, 1.0


def pairs(r, v, lr, d8, has_term, vs, adv):
    """The pair kernel on the arrays ``gaescan.vtrace`` hands the lanes kernel
    (γ=0.99, λ=1, ρ̄=c̄=ρ̄_pg=1, ``last_value`` and ``last_trace`` 0)."""
    R = r.shape[0]
    gcol, lcol = np.full(R, GAMMA, np.float32), np.ones(R, np.float32)
    zero = np.zeros(R, np.float32)
    nf = np.zeros((1, 1), np.uint8)
    cpu_vtrace.vtrace_fused(r, v, lr, v, False, d8 if has_term else nf, has_term, nf, gcol, lcol, zero, zero,
                            RHO_BAR, C_BAR, RHO_BAR, vs, adv)


def sweep(r, v, lr, d8, has_term, vs, adv):
    """The time-major sweeping kernel on ``(T, R)`` arrays, with the arguments
    ``gaescan.vtrace(..., axis=0)`` hands the lanes kernel."""
    R = r.shape[1]
    gcol, lcol = np.full(R, GAMMA, np.float32), np.ones(R, np.float32)
    zero = np.zeros(R, np.float32)
    nf = np.zeros((1, 1), np.uint8)
    cpu_vtrace.vtrace_timemajor(r, v, lr, v, False, d8 if has_term else nf, has_term, nf, gcol, lcol, zero, zero,
                                RHO_BAR, C_BAR, RHO_BAR, vs, adv)


def inputs(R: int, T: int) -> tuple:
    """``(rng, rewards, values, log-ratios, dones)``: the seeded float32 inputs
    of the V-trace benchmarks (log-ratios N(0, 0.3²), dones at rate 0.01)."""
    rng = np.random.default_rng(0)
    r = rng.standard_normal((R, T), dtype=np.float32)
    v = rng.standard_normal((R, T), dtype=np.float32)
    lr = (0.3 * rng.standard_normal((R, T))).astype(np.float32)
    return rng, r, v, lr, rng.random((R, T)) < 0.01


def main(argv=None) -> None:
    args = ab_args(__doc__, argv)
    R, T = 256, 131072
    rng, r, v, lr, d = inputs(R, T)
    d8 = d.view(np.uint8)
    vs, adv = np.empty_like(r), np.empty_like(r)
    vs2, adv2 = np.empty_like(r), np.empty_like(r)

    def lanes(has):
        gaescan.vtrace(r, v, lr, gamma=GAMMA, dones=d if has else None, out=(vs, adv))

    diff = _agreement(lanes, lambda has: pairs(r, v, lr, d8, has, vs2, adv2), (vs, adv), (vs2, adv2), "pairs")
    print(f"# python benchmarks/vtrace_lanes_bench.py --repeat {args.repeat} --rounds {args.rounds}")
    print(f"# {machine()}")
    print(f"# [{R}, {T}] float32, gamma={GAMMA}; lanes vs pairs: relative L2 at most {diff:.1e} "
          f"(vs and advantages, both cases); medians of {args.repeat}, the two kernels timed in turn;")
    print("# x triad = bytes one pass moves (20 per step, 21 with dones) / time / triad GB/s of the same round")
    _rounds(args, R * T, "pairs", lambda has: pairs(r, v, lr, d8, has, vs2, adv2), lanes)

    # Time-major: the same element count as [T, B] = [131072, 256], axis=0.
    rt, vt, lrt, dt = (np.ascontiguousarray(x.reshape(T, R)) for x in (r, v, lr, d))
    d8t = dt.view(np.uint8)
    vst, advt, vst2, advt2 = (np.empty_like(rt) for _ in range(4))

    def lanes_tm(has):
        gaescan.vtrace(rt, vt, lrt, gamma=GAMMA, dones=dt if has else None, axis=0, out=(vst, advt))

    def sweep_tm(has):
        sweep(rt, vt, lrt, d8t, has, vst2, advt2)

    diff = _agreement(lanes_tm, sweep_tm, (vst, advt), (vst2, advt2), "sweep")
    print(f"# time-major [{T}, {R}] float32, axis=0; lanes vs sweep: relative L2 at most {diff:.1e}")
    _rounds(args, R * T, "sweep", sweep_tm, lanes_tm)


def _agreement(lanes, base, outs, base_outs, name):
    """The largest relative L2 difference of the lanes kernel's outputs from the
    baseline's, with and without dones; exits where it exceeds 1e-6."""
    diffs = []
    for has in (True, False):
        lanes(has)
        base(has)
        for a, b in zip(outs, base_outs, strict=True):
            diffs.append(float(np.linalg.norm((a - b).astype(np.float64)) / np.linalg.norm(b.astype(np.float64))))
        if max(diffs) > 1e-6:
            raise SystemExit(f"lanes and {name} differ: dones={has}, relative L2 {max(diffs):.2e}")
    return max(diffs)


def _rounds(args, n, name, base, lanes):
    """The table: per round, a triad, then the baseline and the lanes kernel in
    turn, with and without dones."""
    print(f"{'round':>5s} {'triad GB/s':>10s} {'dones':>5s} {name + ' ms':>9s} {'x triad':>7s} "
          f"{'lanes ms':>9s} {'x triad':>7s} {name + '/lanes':>11s}")
    for k in range(args.rounds):
        tri = _triad_bw(n, args.repeat)
        for has in (True, False):
            nbytes = n * (21 if has else 20)
            t_p, t_l = _alternating(lambda has=has: base(has), lambda has=has: lanes(has), args.repeat)
            print(f"{k + 1:5d} {tri:10.1f} {has!s:>5s} {t_p * 1e3:9.1f} {nbytes / t_p / 1e9 / tri:7.2f} "
                  f"{t_l * 1e3:9.1f} {nbytes / t_l / 1e9 / tri:7.2f} {t_p / t_l:11.2f}")

if __name__ == "__main__":
    main()
