"""Memory direction probe and the batch-major kernels against a baseline.

Run: ``python benchmarks/stream_direction.py [--repeat N] [--old PATH]``.

(a) The probe: a ``prange`` copy ``out = r - v`` over ``[256, 131072]``
float32 rows, once walking each row upwards in memory and once walking each
row from its end, in GB/s (12 bytes per element), beside a STREAM triad over
the same element count.  A CPU whose hardware prefetchers do not follow
descending streams shows a gap between the two walks.

(b) Each batch-major kernel case through :func:`gaescan.gae`,
:func:`gaescan.discounted_returns` and :func:`gaescan.linear_scan` on the
same shape: median time, GB/s and × triad (a float32 triad over the same
element count, timed in turn with the case's runs).  With ``--old PATH`` (a copy of
another version of ``gaescan/kernels/cpu.py``, imported as a module in its
place) each case also runs on that version, old and new runs alternating, so
that both see the same machine load.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time

import numba
import numpy as np
from numba import njit, prange

import gaescan
from gaescan.backends import numba_cpu


@njit(parallel=True, cache=True)
def _triad(a, b, c, s):
    for i in prange(a.size):
        a[i] = b[i] + s * c[i]


@njit(parallel=True, cache=True)
def _copy_up(r, v, out):
    R, T = r.shape
    for i in prange(R):
        for t in range(T):
            out[i, t] = r[i, t] - v[i, t]


@njit(parallel=True, cache=True)
def _copy_down(r, v, out):
    R, T = r.shape
    for i in prange(R):
        for j in range(T):
            t = T - 1 - j
            out[i, t] = r[i, t] - v[i, t]


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", "unknown CPU").strip()
    return f"{model}, {fields.get('CPU(s)', '?').strip()} CPUs"


def _time(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _medians(fs, repeat):
    """Median time of each function, the functions run in turn ``repeat`` times
    (after one warm-up call each)."""
    for f in fs:
        f()
    ts = [[] for _ in fs]
    for _ in range(repeat):
        for k, f in enumerate(fs):
            ts[k].append(_time(f))
    return [float(np.median(t)) for t in ts]


def _load(path: str):
    name = "gaescan.kernels._cpu_baseline"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _on(mod, f):
    """``f`` with the backend's kernels taken from ``mod``."""
    def run():
        saved = numba_cpu.cpu
        numba_cpu.cpu = mod
        # the backend caches the chosen kernel per call structure
        getattr(numba_cpu, "_PREPS", {}).clear()
        try:
            f()
        finally:
            numba_cpu.cpu = saved
            getattr(numba_cpu, "_PREPS", {}).clear()
    return run


def _cases(B, T, dtype, rng):
    N = B * T
    r = rng.standard_normal((B, T), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((B, T), dtype=np.float32).astype(dtype)
    nv = rng.standard_normal((B, T), dtype=np.float32).astype(dtype)
    d = rng.random((B, T), dtype=np.float32) < 1e-3
    tr = rng.random((B, T), dtype=np.float32) < 1e-3
    m = np.ones((B, T), dtype=bool)
    m[:, : T // 8] = False  # a prompt prefix, then the response
    a = rng.uniform(0.9, 1.0, (B, T)).astype(dtype)
    # packed: one row of segments of 1024 to 8192 steps
    lens = rng.integers(1024, 8193, N // 1024)
    cu = np.concatenate([[0], np.cumsum(lens)])
    cu = cu[cu < N]
    cu = np.append(cu, N)
    o1, o2 = np.empty_like(r), np.empty_like(r)
    p1, p2 = o1.reshape(-1), o2.reshape(-1)
    rp, vp = r.reshape(-1), v.reshape(-1)
    # (name, (data arrays, flag arrays) read or written, call)
    return [
        ("gae dones", (4, 1), lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(o1, o2))),
        ("gae plain", (4, 0), lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, out=(o1, o2))),
        ("gae mask (prompt prefix), gamma=1", (4, 1),
         lambda: gaescan.gae(r, v, gamma=1.0, lam=0.95, mask=m, out=(o1, o2))),
        ("gae next_values+terminated+truncated", (5, 2),
         lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=d, truncated=tr,
                             out=(o1, o2))),
        (f"gae packed, {len(cu) - 1} segments", (4, 0),
         lambda: gaescan.gae(rp, vp, gamma=0.99, lam=0.95, cu_seqlens=cu, out=(p1, p2))),
        ("discounted_returns dones", (2, 1), lambda: gaescan.discounted_returns(r, gamma=0.99, dones=d, out=o1)),
        ("linear_scan forward, per-step a", (3, 0), lambda: gaescan.linear_scan(a, r, out=o1)),
        ("linear_scan reverse, per-step a", (3, 0), lambda: gaescan.linear_scan(a, r, reverse=True, out=o1)),
    ]


def _probe(B, T, rep):
    """Print the probe; return the triad's GB/s."""
    N = B * T
    a = np.empty(N, np.float32)
    b = np.ones(N, np.float32)
    c = np.ones(N, np.float32)
    r = np.random.default_rng(0).standard_normal((B, T), dtype=np.float32)
    v = np.ones((B, T), np.float32)
    out = np.empty_like(r)
    t_triad, t_up, t_down = _medians([lambda: _triad(a, b, c, np.float32(3.0)), lambda: _copy_up(r, v, out),
                                      lambda: _copy_down(r, v, out)], rep)
    bw = 12 * N / t_triad / 1e9  # float32 triad: 12 bytes per element
    print("(a) probe, float32                      median     GB/s")
    print(f"    STREAM triad                    {t_triad * 1e3:9.2f} ms {bw:7.1f}")
    print(f"    copy r - v, rows upwards        {t_up * 1e3:9.2f} ms {12 * N / t_up / 1e9:7.1f}")
    print(f"    copy r - v, rows downwards      {t_down * 1e3:9.2f} ms {12 * N / t_down / 1e9:7.1f}")
    print(f"    downwards / upwards bandwidth   {t_up / t_down:9.2f}\n")
    return bw


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--old", help="path of a baseline copy of gaescan/kernels/cpu.py")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--shape", type=int, nargs=2, default=(256, 131072), metavar=("B", "T"))
    args = ap.parse_args(argv)
    B, T = args.shape
    N = B * T
    dtype = np.dtype(args.dtype)
    rep = args.repeat
    print(f"CPU: {_cpu_model()}; Numba threads: {numba.get_num_threads()}")
    print(f"shape [{B}, {T}] {dtype}, medians of {rep}\n")

    _probe(B, T, rep)
    ta = np.empty(N, np.float32)
    tb = np.ones(N, np.float32)
    tc = np.ones(N, np.float32)

    def triad():
        _triad(ta, tb, tc, np.float32(3.0))

    old = _load(args.old) if args.old else None
    print("(b) kernels" + (f" (old: {args.old})" if old else ""))
    head = f"    {'case':40s} {'new':>10s} {'GB/s':>6s} {'x triad':>7s}"
    if old:
        head += f" {'old':>10s} {'x triad':>7s} {'new/old':>7s}"
    print(head)
    for name, per, f in _cases(B, T, dtype, np.random.default_rng(1)):
        nbytes = N * (per[0] * dtype.itemsize + per[1])
        # the triad runs in each case's rotation too: the × triad of a case
        # is against the triad under the same machine load
        fs = [triad, f] + ([_on(old, f)] if old else [])
        tt, *ts = _medians(fs, rep)
        bw = 12 * N / tt / 1e9
        gbs = nbytes / ts[0] / 1e9
        line = f"    {name:40s} {ts[0] * 1e3:8.2f}ms {gbs:6.1f} {gbs / bw:7.2f}"
        if old:
            gbo = nbytes / ts[1] / 1e9
            line += f" {ts[1] * 1e3:8.2f}ms {gbo / bw:7.2f} {ts[1] / ts[0]:7.2f}"
        print(line, flush=True)
    print("\nnew/old > 1: the new kernels are faster; x triad: against a float32 triad over the same element "
          "count, timed in the same rotation")


if __name__ == "__main__":
    main()
