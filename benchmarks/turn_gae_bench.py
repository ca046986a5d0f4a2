"""CPU benchmark of :func:`gaescan.turn_gae` against the memory limit.

Run: ``python benchmarks/turn_gae_bench.py [--repeat N] [--B B] [--T T] [--turns K] [--numpy] [--stream-ab]``.

Prints medians beside a Numba ``prange`` STREAM triad over the same element
count, measured in the same run (see ``benchmarks/cpu_bench.py``).  Turn-level
GAE moves 20 bytes per float32 token: rewards, values and int32 turn ids
read (4 each), the advantages and returns written (4 each); ``× triad`` is
that effective bandwidth over the triad's; the note gives the same ratio
against a triad run alternating with the case's runs (both under the same
machine load).  A case with a bool mask (tool
observation spans, 1 byte more per token) and token-level GAE (16 bytes per
step) run on the same inputs for comparison.

``--stream-ab`` adds the kernel's output stores side by side: the same
calls with non-temporal stores (outputs of ``numba_cpu.STREAM_MIN_BYTES``
and up, the default) and with ordinary stores (the threshold raised), the
two alternating call by call for ``--repeat`` rounds, in one process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from cpu_bench import Table, _median, _triad, _triad_bw, machine  # noqa: E402

import gaescan  # noqa: E402


def _interleaved(f, N, rep):
    """The case's ratio to a triad over ``N`` float32 elements timed in turn with
    it (one triad run before each case run), so that both see the same load:
    ``(case bytes/s) / (triad bytes/s)`` per byte counted, as a factor to apply
    to the case's bytes per step."""
    a, b, c = np.empty(N, np.float32), np.ones(N, np.float32), np.ones(N, np.float32)
    s = np.float32(3.0)
    ts, tt = [], []
    f()
    _triad(a, b, c, s)
    for _ in range(rep):
        t0 = time.perf_counter()
        _triad(a, b, c, s)
        t1 = time.perf_counter()
        f()
        t2 = time.perf_counter()
        tt.append(t1 - t0)
        ts.append(t2 - t1)
    return float(np.median(tt)) / float(np.median(ts)) / 12


def _stream_ab(cases, rep):
    """Medians (and quartiles) of each case with non-temporal and with ordinary
    output stores, timed alternately, and their ratio per round."""
    from gaescan.backends import numba_cpu

    default = numba_cpu.STREAM_MIN_BYTES
    times = {(name, s): [] for name, _ in cases for s in (False, True)}
    try:
        for _ in range(rep):
            for name, f in cases:
                for s in (False, True):
                    numba_cpu.STREAM_MIN_BYTES = default if s else 1 << 62
                    t0 = time.perf_counter()
                    f()
                    times[name, s].append(time.perf_counter() - t0)
    finally:
        numba_cpu.STREAM_MIN_BYTES = default
    print(f"output stores, alternating call by call, {rep} rounds: median [25th, 75th percentile] in ms")
    for name, _ in cases:
        o, n = (np.array(times[name, s]) * 1e3 for s in (False, True))
        print(f"  {name:48s} ordinary {np.median(o):6.2f} [{np.percentile(o, 25):.2f}, "
              f"{np.percentile(o, 75):.2f}]  non-temporal {np.median(n):6.2f} [{np.percentile(n, 25):.2f}, "
              f"{np.percentile(n, 75):.2f}]  ordinary/non-temporal {np.median(o / n):.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--numpy", action="store_true", help="also time backend='numpy' (slow)")
    ap.add_argument("--stream-ab", action="store_true",
                    help="also non-temporal against ordinary output stores, alternating")
    args = ap.parse_args(argv)
    B, T, K, rep = args.B, args.T, args.turns, args.repeat
    N = B * T
    rng = np.random.default_rng(0)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    # K turns per row, cut at random positions (turns of unequal length)
    ids = np.empty((B, T), dtype=np.int32)
    for b in range(B):
        seg = np.zeros(T, dtype=np.int32)
        seg[np.sort(rng.choice(np.arange(1, T), size=K - 1, replace=False))] = 1
        ids[b] = np.cumsum(seg)
    # tool observations: the second half of every turn but the last is masked
    mask = np.ones((B, T), dtype=bool)
    for b in range(B):
        starts = np.flatnonzero(np.diff(ids[b], prepend=-1))
        ends = np.append(starts[1:], T)
        for s, e in zip(starts[:-1], ends[:-1], strict=True):
            mask[b, (s + e) // 2:e] = False
    adv, ret = np.empty_like(r), np.empty_like(r)
    tab = Table()
    bw = _triad_bw(N, rep)
    tab.add(f"STREAM triad, {N} elements (f32)", 12 * N / bw / 1e9, 12, N, bw)
    cases = [
        (f"turn_gae [{B}, {T}] f32, {K} turns/row", 20, "target >= 0.50x",
         lambda: gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95, out=(adv, ret))),
        (f"turn_gae + mask [{B}, {T}] f32, {K} turns/row", 21, "",
         lambda: gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95, mask=mask, out=(adv, ret))),
        (f"gae plain [{B}, {T}] f32 (for comparison)", 16, "",
         lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, out=(adv, ret))),
    ]
    for name, per_step, note, f in cases:
        t = _median(f, rep)
        x = _interleaved(f, N, rep) * per_step
        tab.add(name, t, per_step, N, bw, f"{x:.2f}x a triad timed in turn; {note}".rstrip("; "))
    if args.numpy:
        t = _median(lambda: gaescan.turn_gae(r, v, ids, gamma=0.99, lam=0.95, backend="numpy"),
                    max(1, rep // 3))
        tab.add(f"turn_gae [{B}, {T}] f32, backend='numpy'", t, 20, N, bw)
    print(machine())
    tab.print()
    if args.stream_ab:
        _stream_ab([(name, f) for name, _, _, f in cases[:2]], max(rep, 25))


if __name__ == "__main__":
    main()
