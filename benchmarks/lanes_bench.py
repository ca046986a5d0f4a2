"""Batch-major GAE with eight rows in SIMD lanes (the default) against rows in pairs.

Run: ``python benchmarks/lanes_bench.py [--repeat N] [--rounds N]``.

``gaescan.gae`` on float32 ``[256, 131072]`` rows, plain and with dones, runs
:func:`gaescan.kernels.cpu.gae_lanes` (eight rows per SIMD register, see
:mod:`gaescan.kernels._lanes`), as it does with ``next_values``,
terminations and truncations, and with a mask (a prompt-like prefix of each
row).  The same process times the kernel it replaces,
:func:`gaescan.kernels.cpu.gae_rows_fused` (two rows per loop), on
the same inputs into the same preallocated outputs, the two calls in turn
(medians of each), and a STREAM triad over the same element count, round
after round.  Both state widths: γ=0.99, λ=0.95
(float32 state) and γ=λ=0.999 (float64 state).  Before timing, the script
checks that both give the same bits.  Figures are per machine: commit the
output under ``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import gaescan
from gaescan.kernels import cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import _triad_bw, machine  # noqa: E402


def pairs(r, v, d8, kind, gamma, lam, adv, ret, nv=None, tr8=None):
    """The pair kernel on the arrays ``gaescan.gae`` would hand it (float32 state where it would);
    ``kind``: "dones", "plain", "next" (``nv`` with terminations ``d8`` and truncations ``tr8``)
    or "mask" (the mask ``tr8``)."""
    R = r.shape[0]
    gcol, lcol = np.full(R, gamma, np.float32), np.full(R, lam, np.float32)
    zero = np.zeros(R, np.float32)
    narrow = abs(float(np.float32(gamma)) * float(np.float32(lam))) <= float(np.float32(0.99))
    k = cpu.gae_rows_fused.f32_state if narrow else cpu.gae_rows_fused
    nf = np.zeros((1, 1), np.uint8)
    if kind == "next":
        k(r, v, nv, True, d8, True, tr8, nf, False, gcol, lcol, zero, zero, adv, ret)
        return
    if kind == "mask":
        k(r, v, v, False, nf, False, nf, tr8, True, gcol, lcol, zero, zero, adv, ret)
        return
    has_term = kind == "dones"
    k(r, v, v, False, d8 if has_term else nf, has_term, nf, nf, False, gcol, lcol, zero, zero, adv, ret)


def _alternating(f, g, repeat):
    """Medians of ``f`` and ``g`` timed in turn, call after call (a shared host's
    load drifts: alternating gives both the same conditions)."""
    f()
    g()
    tf, tg = [], []
    for _ in range(repeat):
        for fn, ts in ((f, tf), (g, tg)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return float(np.median(tf)), float(np.median(tg))


def ab_args(doc: str, argv=None) -> argparse.Namespace:
    """``--repeat`` (calls per median) and ``--rounds`` of an in-turn comparison
    script whose docstring is ``doc``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    return ap.parse_args(argv)


def ab_rounds(args: argparse.Namespace, n: int, cases: dict, base, names: tuple[str, str]) -> None:
    """The table of an in-turn comparison over ``n`` elements: per round a
    triad, then for each case ``name: (call, bytes per step)`` the baseline
    ``base(call)`` and the default ``call`` in turn (:func:`_alternating`),
    with × triad against that round's triad and their ratio."""
    b, d = names
    print(f"{'round':>5s} {'triad GB/s':>10s} {'case':>17s} {'B':>3s} {b + ' ms':>9s} {'x triad':>7s} "
          f"{d + ' ms':>9s} {'x triad':>7s} {b + '/' + d:>11s}")
    for k in range(args.rounds):
        tri = _triad_bw(n, args.repeat)
        for name, (call, per_step) in cases.items():
            tb, td = _alternating(base(call), call, args.repeat)
            gb = n * per_step / 1e9
            print(f"{k + 1:5d} {tri:10.1f} {name:>17s} {per_step:3d} {tb * 1e3:9.1f} {gb / tb / tri:7.2f} "
                  f"{td * 1e3:9.1f} {gb / td / tri:7.2f} {tb / td:11.2f}")


def main(argv=None) -> None:
    args = ab_args(__doc__, argv)
    R, T = 256, 131072
    rng = np.random.default_rng(0)
    r = rng.standard_normal((R, T), dtype=np.float32)
    v = rng.standard_normal((R, T), dtype=np.float32)
    d = rng.random((R, T)) < 0.01
    d8 = d.view(np.uint8)
    # next_values with terminations and truncations, each at a rate of 1e-3
    nv = rng.standard_normal((R, T), dtype=np.float32)
    tm, tr = rng.random((R, T)) < 1e-3, rng.random((R, T)) < 1e-3
    # a mask: each row's first 1/8 masked out, like a prompt
    m = np.ones((R, T), bool)
    m[:, : T // 8] = False
    adv, ret = np.empty_like(r), np.empty_like(r)
    adv2, ret2 = np.empty_like(r), np.empty_like(r)
    kinds = {"dones": (17, dict(dones=d)), "plain": (16, {}),
             "next": (22, dict(next_values=nv, terminated=tm, truncated=tr)), "mask": (17, dict(mask=m))}
    cases = [(g, lam, kind) for g, lam in ((0.99, 0.95), (0.999, 0.999)) for kind in kinds]

    def run_pairs(g, lam, kind):
        if kind == "next":
            pairs(r, v, tm.view(np.uint8), kind, g, lam, adv2, ret2, nv, tr.view(np.uint8))
        elif kind == "mask":
            pairs(r, v, d8, kind, g, lam, adv2, ret2, tr8=m.view(np.uint8))
        else:
            pairs(r, v, d8, kind, g, lam, adv2, ret2)

    def run_lanes(g, lam, kind):
        gaescan.gae(r, v, gamma=g, lam=lam, out=(adv, ret), **kinds[kind][1])

    for g, lam, kind in cases:
        run_lanes(g, lam, kind)
        run_pairs(g, lam, kind)
        if not (np.array_equal(adv.view(np.uint32), adv2.view(np.uint32))
                and np.array_equal(ret.view(np.uint32), ret2.view(np.uint32))):
            raise SystemExit(f"lanes and pairs differ: gamma={g} lam={lam} {kind}")
    print(f"# python benchmarks/lanes_bench.py --repeat {args.repeat} --rounds {args.rounds}")
    print(f"# {machine()}")
    print(f"# [{R}, {T}] float32; bits: lanes == pairs on all {len(cases)} cases; medians of {args.repeat}, "
          "the two kernels timed in turn;")
    print("# x triad = bytes one pass moves (16 per step plain, 17 with dones or a mask, 22 with next values")
    print("#   and both flags) / time / triad GB/s of the same round")
    print(f"{'round':>5s} {'triad GB/s':>10s} {'gamma':>6s} {'lam':>6s} {'case':>5s} {'pairs ms':>9s} "
          f"{'x triad':>7s} {'lanes ms':>9s} {'x triad':>7s} {'pairs/lanes':>11s}")
    for k in range(args.rounds):
        tri = _triad_bw(R * T, args.repeat)
        for g, lam, kind in cases:
            nbytes = R * T * kinds[kind][0]
            t_p, t_l = _alternating(lambda g=g, lam=lam, kind=kind: run_pairs(g, lam, kind),
                                    lambda g=g, lam=lam, kind=kind: run_lanes(g, lam, kind), args.repeat)
            print(f"{k + 1:5d} {tri:10.1f} {g:6.3f} {lam:6.3f} {kind:>5s} {t_p * 1e3:9.1f} "
                  f"{nbytes / t_p / 1e9 / tri:7.2f} {t_l * 1e3:9.1f} {nbytes / t_l / 1e9 / tri:7.2f} {t_p / t_l:11.2f}")


if __name__ == "__main__":
    main()
