"""Where batch-major GAE spends its time: memory order, or the chain.

Run: ``python benchmarks/row_chain_probe.py [--repeat N]``.

(a) Memory order over memory, ``[256, 131072]`` float32, 2 threads: a map
with GAE's five streams (reads rewards, values, a uint8 flag; writes two
outputs; no loop-carried value) walking each row upwards, walking it from its
end, and walking it in tiles of ``n`` steps, last tile first, each tile
upwards.  Beside them, :func:`gaescan.gae` with dones on the same arrays and
a STREAM triad over the same element count.  When the maps run near the
triad and GAE does not, GAE is bound by its chain, not by memory order.

(b) The chain alone in cache, one thread: ``A_t = x_t`` if ``done_t`` else
``x_t + γλ·A_{t+1}`` over a scratch of ``Q`` rows stored step-major
(``[t, q]``, the layout in which one vector holds a step of ``Q`` rows), in
the two loop forms Numba can express without intrinsics: ``Q`` scalar chains
written out (``Q = 8``), and an inner loop over the rows that reads the
previous step from the scratch (``Q = 8 .. 64``).  Each prints ns per
row-step and how many 256-bit FMAs LLVM emitted, beside the default kernel's
ns per step on an in-cache ``[16, 4096]`` call.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import _median, _triad, machine  # noqa: E402

import gaescan  # noqa: E402

_FM = {"contract"}
_TL = 512  # steps per scratch tile in (b)


@njit(fastmath=_FM, inline="always")
def _map_span(r, v, d, adv, ret, i, lo, n):
    for j in range(n):
        t = np.uint64(lo + j)
        x = r[i, t] - v[i, t]
        adv[i, t] = x
        ret[i, t] = x + (np.float32(1) if d[i, t] else np.float32(0))


@njit(parallel=True, fastmath=_FM, cache=True)
def map_tiles_last_first(r, v, d, adv, ret, tile):
    """The five-stream map, each row in tiles of ``tile`` steps, last tile first."""
    R, T = r.shape
    for i in prange(R):
        nt = (T + tile - 1) // tile
        for q in range(nt):
            lo = (nt - 1 - q) * tile
            _map_span(r, v, d, adv, ret, i, lo, min(tile, T - lo))


@njit(parallel=True, fastmath=_FM, cache=True)
def map_descending(r, v, d, adv, ret):
    """The five-stream map, each row from its end."""
    R, T = r.shape
    for i in prange(R):
        for j in range(T):
            t = np.uint64(T - 1 - j)
            x = r[i, t] - v[i, t]
            adv[i, t] = x
            ret[i, t] = x + (np.float32(1) if d[i, t] else np.float32(0))


@njit(fastmath=_FM)
def chain_scalars8(D, F, gl, reps):
    """Eight chains written out, reading step-major scratch ``D[t, 0:8]``."""
    for _ in range(reps):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for j in range(_TL):
            s = np.uint64(_TL - 1 - j)
            x = D[s, 0]
            a0 = x if F[s, 0] else x + gl * a0
            D[s, 0] = a0
            x = D[s, 1]
            a1 = x if F[s, 1] else x + gl * a1
            D[s, 1] = a1
            x = D[s, 2]
            a2 = x if F[s, 2] else x + gl * a2
            D[s, 2] = a2
            x = D[s, 3]
            a3 = x if F[s, 3] else x + gl * a3
            D[s, 3] = a3
            x = D[s, 4]
            a4 = x if F[s, 4] else x + gl * a4
            D[s, 4] = a4
            x = D[s, 5]
            a5 = x if F[s, 5] else x + gl * a5
            D[s, 5] = a5
            x = D[s, 6]
            a6 = x if F[s, 6] else x + gl * a6
            D[s, 6] = a6
            x = D[s, 7]
            a7 = x if F[s, 7] else x + gl * a7
            D[s, 7] = a7


def _chain_rows(Q):
    @njit(fastmath=_FM)
    def chain(D, F, gl, reps):
        # D[_TL, Q] holds the carry entering the tile.
        for _ in range(reps):
            for j in range(_TL - 1):
                s = np.uint64(_TL - 2 - j)
                for q in range(Q):
                    x = D[s, q]
                    D[s, q] = x if F[s, q] else x + gl * D[s + np.uint64(1), q]
    return chain


def _ymm_fmas(dispatcher):
    asm = "\n".join(dispatcher.inspect_asm().values())
    return len(re.findall(r"vfmadd\w*pd[^\n]*ymm", asm))


def memory_order(rep):
    B, T = 256, 131072
    rng = np.random.default_rng(0)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    dones = rng.random((B, T)) < 0.001
    d = dones.view(np.uint8)
    adv, ret = np.empty_like(r), np.empty_like(r)
    N = B * T
    a, b, c = np.empty(N, np.float32), np.ones(N, np.float32), np.ones(N, np.float32)
    t_triad = _median(lambda: _triad(a, b, c, np.float32(3.0)), rep)
    bw = 12 * N / t_triad / 1e9
    print(f"(a) memory order, [{B}, {T}] float32, 17 bytes per step; STREAM triad {bw:.1f} GB/s "
          f"({t_triad * 1e3:.2f} ms); medians of {rep}")
    cases = [("map, each row upwards", lambda: map_tiles_last_first(r, v, d, adv, ret, T)),
             ("map, each row from its end", lambda: map_descending(r, v, d, adv, ret))]
    for tile in (1024, 2048, 8192, 32768):
        cases.append((f"map, tiles of {tile} last first", lambda n=tile: map_tiles_last_first(r, v, d, adv, ret, n)))
    cases.append(("gaescan.gae, dones", lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=dones, out=(adv, ret))))
    print(f"{'case':36s} {'median':>10s} {'GB/s':>7s} {'x triad':>8s}")
    for name, f in cases:
        t = _median(f, rep)
        print(f"{name:36s} {t * 1e3:8.2f}ms {17 * N / t / 1e9:7.1f} {17 * N / t / 1e9 / bw:8.2f}")


def chain_forms(rep):
    reps = 200
    print(f"\n(b) the chain alone, in cache, one thread: a tile of {_TL} steps x Q rows, step-major "
          f"float64 scratch; medians of {rep} timings of {reps} tiles")
    print(f"{'form':44s} {'ns/row-step':>11s} {'ymm FMAs':>9s}")
    rng = np.random.default_rng(1)
    D = rng.random((_TL, 8))
    F = rng.random((_TL, 8)) < 0.01
    t = _median(lambda: chain_scalars8(D, F, 0.94, reps), rep)
    print(f"{'8 scalar chains written out':44s} {t / (reps * _TL * 8) * 1e9:11.3f} {_ymm_fmas(chain_scalars8):9d}")
    for Q in (8, 16, 32, 64):
        fn = _chain_rows(Q)
        D = rng.random((_TL, Q))
        F = rng.random((_TL, Q)) < 0.01
        t = _median(lambda fn=fn, D=D, F=F: fn(D, F, 0.94, reps), rep)
        print(f"{f'inner loop over Q={Q} rows':44s} {t / (reps * (_TL - 1) * Q) * 1e9:11.3f} {_ymm_fmas(fn):9d}")
    r = rng.standard_normal((16, 4096), dtype=np.float32)
    v = rng.standard_normal((16, 4096), dtype=np.float32)
    dn = rng.random((16, 4096)) < 0.001
    adv, ret = np.empty_like(r), np.empty_like(r)
    t = _median(lambda: [gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=dn, out=(adv, ret)) for _ in range(100)], rep)
    print(f"{'default kernel, whole GAE step, [16, 4096]':44s} {t / 100 / r.size * 1e9:11.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--part", choices=("a", "b", "both"), default="both")
    args = p.parse_args(argv)
    print(f"# python benchmarks/row_chain_probe.py --repeat {args.repeat} --part {args.part}")
    print(f"# machine: {machine()}")
    if args.part in ("a", "both"):
        memory_order(args.repeat)
    if args.part in ("b", "both"):
        chain_forms(args.repeat)


if __name__ == "__main__":
    main()
