"""Side-by-side CPU benchmark of the "numba" backend (issue 3 targets).

Run: ``python benchmarks/cpu_bench.py [--repeat N]``.  Prints one table of
medians; bandwidth ratios are against a Numba ``prange`` STREAM triad over
the same element count measured in the same process.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit, prange

import gaescan


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


def _serial_numpy(r, v, g, l_):
    """Vectorised over the batch, Python loop over time (no dones)."""
    adv = np.empty_like(r)
    a = np.zeros(r.shape[0], r.dtype)
    vn = np.zeros(r.shape[0], r.dtype)
    g, gl = r.dtype.type(g), r.dtype.type(g * l_)
    for t in range(r.shape[1] - 1, -1, -1):
        a = r[:, t] + g * vn - v[:, t] + gl * a
        adv[:, t] = a
        vn = v[:, t]
    return adv, adv + v


def _chunk_matmul(r, v, g, l_, C=256):
    """The published chunk-scan: C×C decay-kernel matmul per chunk, constant γλ."""
    dt = r.dtype
    B, T = r.shape
    vn = np.concatenate([v[:, 1:], np.zeros((B, 1), dt)], axis=1)
    delta = r + dt.type(g) * vn - v
    c = dt.type(g * l_)
    i = np.arange(C)
    e = (i[None, :] - i[:, None]).astype(dt)
    K = np.where(e >= 0, c ** np.maximum(e, 0), 0).astype(dt)  # K[t, s] = c^(s-t), s >= t
    n = T // C
    D = delta.reshape(B, n, C)
    local = D @ K.T
    pw = (c ** (C - i)).astype(dt)  # weight of the next chunk's first A
    adv = np.empty_like(local)
    carry = np.zeros(B, dt)
    for k in range(n - 1, -1, -1):
        adv[:, k] = local[:, k] + pw[None, :] * carry[:, None]
        carry = adv[:, k, 0]
    adv = adv.reshape(B, T)
    return adv, adv + v


def _triad_time(n, rep):
    a = np.empty(n, np.float32)
    b = np.ones(n, np.float32)
    c = np.ones(n, np.float32)
    return _median(lambda: _triad(a, b, c, np.float32(3.0)), rep)


def _batch_major(B, T, rep, rng, row, bw):
    N = B * T
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    d = rng.random((B, T)) < 1e-3
    adv, ret = np.empty_like(r), np.empty_like(r)
    t1 = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(adv, ret)), rep)
    row(f"1. gae dones B={B} T={T}", t1, 17 * N, bw, "target >= 0.70x triad")
    t_plain = _median(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, out=(adv, ret)), rep)
    row(f"3. gae plain B={B} T={T}", t_plain, 16 * N, bw)
    t_ser = _median(lambda: _serial_numpy(r, v, 0.99, 0.95), max(1, rep // 3))
    row("3. serial NumPy loop over T", t_ser, None, None, f"speedup {t_ser / t_plain:.1f}x (target >= 35x)")
    t_mm = _median(lambda: _chunk_matmul(r, v, 0.99, 0.95), max(1, rep // 2))
    row("3. chunk-scan matmul C=256", t_mm, None, None, f"speedup {t_mm / t_plain:.1f}x (target >= 10x)")


def _time_major(Tm, Bm, rep, rng, row):
    Nm = Tm * Bm
    rT = rng.standard_normal((Tm, Bm), dtype=np.float32)
    vT = rng.standard_normal((Tm, Bm), dtype=np.float32)
    dT = rng.random((Tm, Bm)) < 1e-3
    aT, oT = np.empty_like(rT), np.empty_like(rT)
    t2 = _median(lambda: gaescan.gae(rT, vT, gamma=0.99, lam=0.95, dones=dT, axis=0, out=(aT, oT)), rep)
    bw2 = 12 * Nm / _triad_time(Nm, rep) / 1e9  # triad over the same element count
    row(f"2. gae dones time-major T={Tm} B={Bm}", t2, 17 * Nm, bw2, "target >= 0.70x triad")


def _features(B, T, rep, rng, row):
    """Every other fused or general kernel, against the triad over the same count."""
    N = B * T
    bw = 12 * N / _triad_time(N, rep) / 1e9
    row(f"STREAM triad, B*T = {B}*{T}", 12 * N / bw / 1e9, 12 * N, bw)
    r = rng.standard_normal((B, T), dtype=np.float32)
    v = rng.standard_normal((B, T), dtype=np.float32)
    nv = rng.standard_normal((B, T), dtype=np.float32)
    d = rng.random((B, T)) < 1e-3
    tr = rng.random((B, T)) < 1e-3
    # RLHF-style response mask: a prompt prefix, then the response
    m = np.ones((B, T), dtype=bool)
    m[:, : T // 8] = False
    g = rng.uniform(0.9, 1.0, (B, T)).astype(np.float32)
    o1, o2 = np.empty_like(r), np.empty_like(r)
    cases = [
        ("gae mask (prompt prefix), gamma=1", lambda: gaescan.gae(r, v, gamma=1.0, lam=0.95, mask=m, out=(o1, o2)), 17),
        ("gae next_values+terminated+truncated",
         lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=d, truncated=tr, out=(o1, o2)), 22),
        ("gae per-step gamma (general kernel)", lambda: gaescan.gae(r, v, gamma=g, lam=0.95, dones=d, out=(o1, o2)), 21),
        ("discounted_returns dones", lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, out=o1), 9),
        ("linear_scan per-step a", lambda: gaescan.linear_scan(g, r, out=o1), 12),
    ]
    # the same element count as a time-major [T', B'] buffer, B' = 1024 environments
    Tt, Bt = N // 1024, 1024
    rT, vT, nvT, dT, trT = (x.reshape(Tt, Bt) for x in (r, v, nv, d, tr))
    mT = np.ones((Tt, Bt), dtype=bool)
    mT[: Tt // 8] = False
    cases.append(("time-major next_values+term+trunc",
                  lambda: gaescan.gae(rT, vT, gamma=0.99, lam=0.95, next_values=nvT, terminated=dT, truncated=trT,
                                      axis=0, out=(o1.reshape(Tt, Bt), o2.reshape(Tt, Bt))), 22))
    cases.append(("time-major mask (general sweep, gae_tm)",
                  lambda: gaescan.gae(rT, vT, gamma=1.0, lam=0.95, mask=mT, axis=0,
                                      out=(o1.reshape(Tt, Bt), o2.reshape(Tt, Bt))), 17))
    for name, f, per in cases:
        row(f"   {name}", _median(f, rep), per * N, bw)


def _compile_times():
    """Cold compile (empty cache), warm cache, and a fresh process's first call."""
    import os
    import subprocess
    import sys
    import tempfile

    load = "import time; t=time.perf_counter(); from gaescan.backends import numba_cpu; numba_cpu.warmup(); "
    first = ("import time; t=time.perf_counter(); import numpy as np, gaescan; "
             "x=np.zeros((8, 1024), np.float32); gaescan.gae(x, x, gamma=0.99, lam=0.95); ")
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label, code in (("cold compile of every CPU kernel (empty cache)", load),
                            ("same, warm on-disk cache", load),
                            ("fresh process: import + first gae call (warm cache)", first)):
            res = subprocess.run([sys.executable, "-c", code + "print(time.perf_counter()-t)"],
                                 env=env, capture_output=True, text=True, check=True)
            out.append((label, float(res.stdout.strip().splitlines()[-1])))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (smoke test)")
    ap.add_argument("--features", action="store_true", help="also time masks, next_values, returns, scans")
    ap.add_argument("--compile", action="store_true", help="also time cold / warm-cache compilation")
    args = ap.parse_args(argv)
    rep = args.repeat
    B, T = (16, 16384) if args.quick else (256, 131072)
    Tm, Bm = (1024, 512) if args.quick else (8192, 4096)
    rng = np.random.default_rng(0)
    rows = []

    def row(name, sec, bytes_=None, bw=None, extra=""):
        eff = bytes_ / sec / 1e9 if bytes_ else None
        rows.append((name, sec, eff, eff / bw if eff and bw else None, extra))

    t_triad = _triad_time(B * T, rep)
    bw = 12 * B * T / t_triad / 1e9
    row("STREAM triad (numba prange)", t_triad, 12 * B * T, bw)
    _batch_major(B, T, rep, rng, row, bw)
    _time_major(Tm, Bm, rep, rng, row)

    rs = rng.standard_normal((8, 1024), dtype=np.float32)
    vs = rng.standard_normal((8, 1024), dtype=np.float32)
    t4 = _median(lambda: gaescan.gae(rs, vs, gamma=0.99, lam=0.95), max(rep, 201))
    row("4. small call B=8 T=1024", t4, None, None, "target <= 40 us")

    if args.features:
        _features(*((16, 16384) if args.quick else (256, 32768)), rep, rng, row)
    print(f"{'case':44s} {'median':>11s} {'GB/s':>7s} {'x triad':>8s}  note")
    for name, sec, eff, ratio, extra in rows:
        s = f"{sec * 1e3:9.3f}ms" if sec >= 1e-3 else f"{sec * 1e6:9.1f}us"
        print(f"{name:44s} {s:>11s} {'' if eff is None else f'{eff:7.1f}':>7s} "
              f"{'' if ratio is None else f'{ratio:8.2f}':>8s}  {extra}")
    if args.compile:
        for label, sec in _compile_times():
            print(f"{label:52s} {sec:7.2f} s")


if __name__ == "__main__":
    main()
