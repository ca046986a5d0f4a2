"""Side-by-side CPU benchmark of the ``"numba"`` backend against the memory limit.

Run: ``python benchmarks/cpu_bench.py [--repeat N] [--features] [--threads]``.

Every case is timed in one process and printed as a median beside a Numba
``prange`` STREAM triad (``a = b + s·c``, 12 bytes per element in float32)
over the same element count, measured in the same run: ``× triad`` is the
case's effective bandwidth (the bytes one pass must move, counted per step
in the ``B/step`` column) over the triad's.  The seed's two methods (the
serial loop over time and the published NumPy chunk-scan, C = 256,
:mod:`gaescan.bench.baselines`) run on the same inputs.  gaescan's cases
write into ``out=`` buffers allocated once, as a training loop that keeps
its buffers does; the seed's methods allocate their outputs per call, as
they are written.  One more row times ``gae`` plain allocating its outputs
per call, the cost a caller without ``out=`` pays: fresh pages of a large
array are faulted in and zeroed by the operating system on first touch.
The first line
names the machine; ``--threads`` adds the thread-scaling table of the
``[256, 131072]`` case.  Results are per machine: commit the output under
``benchmarks/results/`` with the CPU model in the file name.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import numba
import numpy as np
from numba import njit, prange

import gaescan
from gaescan.bench.baselines import chunk_scan_gae, serial_gae


@njit(parallel=True, cache=True)
def _triad(a, b, c, s):
    for i in prange(a.size):
        a[i] = b[i] + s * c[i]


def _median(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _triad_bw(n, rep, dtype=np.float32):
    """The triad's bandwidth in GB/s over ``n`` elements of ``dtype``."""
    a = np.empty(n, dtype)
    b = np.ones(n, dtype)
    c = np.ones(n, dtype)
    t = _median(lambda: _triad(a, b, c, dtype(3.0)), rep)
    return 3 * a.itemsize * n / t / 1e9


def machine() -> str:
    """CPU model, logical CPUs and versions, for the header of every result."""
    model = platform.processor() or "unknown CPU"
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    model = info.get("model name", model)
    # A virtual machine may name only the vendor ("AMD EPYC"): the family and
    # model numbers tell the core generation apart.
    if "cpu family" in info and "model" in info:
        model += f" (family {info['cpu family']}, model {info['model']})"
    return (f"{model}, {os.cpu_count()} logical CPUs, {numba.get_num_threads()} Numba threads "
            f"({numba.threading_layer() if _triad.signatures else 'layer not started'}); "
            f"numpy {np.__version__}, numba {numba.__version__}, Python {platform.python_version()}")


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, sec, per_step=None, steps=None, bw=None, note=""):
        eff = per_step * steps / sec / 1e9 if per_step else None
        self.rows.append((name, sec, per_step, eff, eff / bw if eff and bw else None, note))

    def print(self):
        print(f"{'case':52s} {'median':>11s} {'B/step':>6s} {'GB/s':>7s} {'x triad':>8s}  note")
        for name, sec, per, eff, ratio, note in self.rows:
            s = f"{sec * 1e3:9.3f}ms" if sec >= 1e-3 else f"{sec * 1e6:9.1f}us"
            print(f"{name:52s} {s:>11s} {'' if per is None else per:>6} "
                  f"{'' if eff is None else f'{eff:7.1f}':>7s} "
                  f"{'' if ratio is None else f'{ratio:8.2f}':>8s}  {note}")


def _inputs(rng, B, T, dtype=np.float32):
    r = rng.standard_normal((B, T), dtype=np.float32).astype(dtype, copy=False)
    v = rng.standard_normal((B, T), dtype=np.float32).astype(dtype, copy=False)
    d = rng.random((B, T), dtype=np.float32) < 1e-3
    return r, v, d


def main_cases(tab, B, T, rep, rng):
    """The batch-major and time-major GAE cases, the seed's methods, the small call."""
    N = B * T
    bw = _triad_bw(N, rep)
    tab.add(f"STREAM triad, {N} elements (f32)", 12 * N / bw / 1e9, 12, N, bw)
    r, v, d = _inputs(rng, B, T)
    adv, ret = np.empty_like(r), np.empty_like(r)
    t_dones = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(adv, ret)), rep)
    tab.add(f"gae dones [{B}, {T}] f32", t_dones, 17, N, bw, "target >= 0.80x")
    t_plain = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, out=(adv, ret)), rep)
    tab.add(f"gae plain [{B}, {T}] f32", t_plain, 16, N, bw, "target >= 0.80x")
    t_ser = _median(lambda: serial_gae(np, r, v, 0.99, 0.95), max(1, rep // 3))
    tab.add("  seed: serial loop over time (plain)", t_ser, None, None, None,
            f"gae plain is {t_ser / t_plain:.1f}x faster (target >= 50x)")
    t_mm = _median(lambda: chunk_scan_gae(np, r, v, 0.99, 0.95, 256), max(1, rep // 2))
    tab.add("  seed: NumPy chunk-scan C=256 (plain)", t_mm, None, None, None,
            f"gae plain is {t_mm / t_plain:.1f}x faster (target >= 15x)")
    t_alloc = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95), rep)
    tab.add("  gae plain, outputs allocated by the call", t_alloc, 16, N, bw,
            f"{t_mm / t_alloc:.1f}x the chunk-scan (which allocates too)")
    t_np = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numpy"), max(1, rep // 2))
    tab.add("  gaescan backend='numpy' (plain)", t_np, 16, N, bw,
            f"{t_ser / t_np:.1f}x the serial loop (target >= 5x)")
    t_ser_d = _median(lambda: serial_gae(np, r, v, 0.99, 0.95, d), max(1, rep // 3))
    tab.add("  seed: serial loop over time (dones)", t_ser_d, None, None, None,
            f"gae dones is {t_ser_d / t_dones:.1f}x faster")
    t_np_d = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numpy"), max(1, rep // 2))
    tab.add("  gaescan backend='numpy' (dones)", t_np_d, 17, N, bw,
            f"{t_ser_d / t_np_d:.1f}x the serial loop with dones")
    adv = ret = None
    r8, v8 = r.astype(np.float64), v.astype(np.float64)
    a8, o8 = np.empty_like(r8), np.empty_like(r8)
    bw8 = _triad_bw(N, rep, np.float64)
    tab.add(f"STREAM triad, {N} elements (f64)", 24 * N / bw8 / 1e9, 24, N, bw8)
    tab.add(f"gae dones [{B}, {T}] f64",
            _median(lambda: gaescan.gae(r8, v8, gamma=0.99, lam=0.95, dones=d, out=(a8, o8)), rep),
            33, N, bw8, "target >= 0.70x")
    tab.add(f"gae plain [{B}, {T}] f64",
            _median(lambda: gaescan.gae(r8, v8, gamma=0.99, lam=0.95, out=(a8, o8)), rep),
            32, N, bw8, "target >= 0.70x")
    r8 = v8 = a8 = o8 = None  # free the float64 copies before the next cases
    Tm, Bm = 8192, N // 8192
    rT, vT, dT = (x.reshape(Tm, Bm) for x in (r, v, d))
    aT, oT = np.empty_like(rT), np.empty_like(rT)
    tab.add(f"gae dones time-major [{Tm}, {Bm}] (axis=0)",
            _median(lambda: gaescan.gae(rT, vT, gamma=0.99, lam=0.95, dones=dT, axis=0, out=(aT, oT)), rep),
            17, N, bw, "target >= 0.80x")
    rs, vs, ds = _inputs(rng, 8, 1024)
    tab.add("small call [8, 1024] f32 dones, validation included",
            _median(lambda: gaescan.gae(rs, vs, gamma=0.99, lam=0.95, dones=ds), max(rep, 501)),
            note="target <= 20 us")
    return r, v, d, bw


def feature_cases(tab, r, v, d, bw, rep, rng, dtype=np.float32):
    """Every other fused or general path on the same element count, in ``dtype``
    (``bw``: the triad's GB/s in that dtype)."""
    B, T = r.shape
    N = B * T
    w = np.dtype(dtype).itemsize
    tag = "" if w == 4 else " f64"
    r, v = r.astype(dtype, copy=False), v.astype(dtype, copy=False)
    nv = rng.standard_normal((B, T), dtype=np.float32).astype(dtype, copy=False)
    tr = rng.random((B, T), dtype=np.float32) < 1e-3
    # RLHF-style response mask: a prompt prefix, then the response
    m = np.ones((B, T), dtype=bool)
    m[:, : T // 8] = False
    a = rng.uniform(0.9, 1.0, (B, T)).astype(dtype)
    o1, o2 = np.empty_like(r), np.empty_like(r)
    # packed: the same steps as one row of variable-length sequences
    lengths = rng.integers(T // 4, 2 * T, size=4 * B)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    cu = cu[cu < N]
    cu = np.append(cu, N).astype(np.int64)
    rp, vp, p1, p2 = r.reshape(N), v.reshape(N), o1.reshape(N), o2.reshape(N)
    # bytes per step: data arrays of ``w`` bytes, flags of one
    cases = [
        ("gae mask (prompt prefix), gamma=1", 4 * w + 1,
         lambda: gaescan.gae(r, v, gamma=1.0, lam=0.95, mask=m, out=(o1, o2))),
        ("gae next_values+terminated+truncated", 5 * w + 2,
         lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=d, truncated=tr, out=(o1, o2))),
        (f"gae packed cu_seqlens ({len(cu) - 1} sequences)", 4 * w,
         lambda: gaescan.gae(rp, vp, gamma=0.99, lam=0.95, cu_seqlens=cu, out=(p1, p2))),
        ("discounted_returns dones", 2 * w + 1, lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, out=o1)),
        ("linear_scan per-step a, reverse", 3 * w, lambda: gaescan.linear_scan(a, r, reverse=True, out=o1)),
        ("linear_scan per-step a, forward", 3 * w, lambda: gaescan.linear_scan(a, r, out=o1)),
        ("gae per-step gamma (general kernel)", 5 * w + 1,
         lambda: gaescan.gae(r, v, gamma=a, lam=0.95, dones=d, out=(o1, o2))),
    ]
    for name, per, f in cases:
        tab.add(name + tag, _median(f, rep), per, N, bw, "target >= 0.70x" if "general" not in name else "")


def thread_table(r, v, d, rep):
    """Thread scaling of GAE with dones on the main shape: 1, 2, 4, ... threads."""
    N = r.size
    adv, ret = np.empty_like(r), np.empty_like(r)
    top = numba.config.NUMBA_NUM_THREADS
    print(f"\nthreads: GAE dones {list(r.shape)} f32 (17 B/step) and the triad at each thread count")
    print(f"{'threads':>7s} {'gae median':>11s} {'GB/s':>7s} {'triad GB/s':>10s} {'x triad':>8s}")
    n = 1
    while n <= top:
        numba.set_num_threads(n)
        bw = _triad_bw(N, rep)
        t = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(adv, ret)), rep)
        eff = 17 * N / t / 1e9
        print(f"{n:7d} {t * 1e3:9.3f}ms {eff:7.1f} {bw:10.1f} {eff / bw:8.2f}")
        n *= 2
    numba.set_num_threads(top)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke test, not a result)")
    ap.add_argument("--features", action="store_true",
                    help="also masks, next_values, packing, returns, scans")
    ap.add_argument("--threads", action="store_true", help="also the thread-scaling table")
    args = ap.parse_args(argv)
    B, T = (16, 16384) if args.quick else (256, 131072)
    rng = np.random.default_rng(0)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    tab = Table()
    r, v, d, bw = main_cases(tab, B, T, args.repeat, rng)
    if args.features:
        feature_cases(tab, r, v, d, bw, args.repeat, rng)
        # The same paths in float64, against the float64 triad.
        bw8 = _triad_bw(r.size, args.repeat, np.float64)
        tab.add("STREAM triad (f64), for the f64 rows below", 24 * r.size / bw8 / 1e9, 24, r.size, bw8)
        feature_cases(tab, r, v, d, bw8, args.repeat, rng, np.float64)
    print(f"# python benchmarks/cpu_bench.py --repeat {args.repeat}"
          f"{' --features' if args.features else ''}{' --threads' if args.threads else ''}"
          f"{' --quick' if args.quick else ''}")
    print(f"# {stamp}; machine: {machine()}; load average at start: {load}")
    print(f"# medians of {args.repeat} timed calls (the small call: of {max(args.repeat, 501)}); "
          "x triad = GB/s over the triad's GB/s on the same element count, same run")
    tab.print()
    if args.threads:
        thread_table(r, v, d, args.repeat)


if __name__ == "__main__":
    main()
