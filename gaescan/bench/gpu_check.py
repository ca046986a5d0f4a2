"""A prepared check of the CUDA backend on a real GPU: correctness, then speed.

Run ``python -m gaescan.bench.gpu_check`` on a machine with a CUDA GPU, CuPy,
numba-cuda (and optionally PyTorch).  It

1. checks ``gaescan.gae``, ``discounted_returns`` and ``linear_scan`` with
   ``backend="cuda"`` against a float64 loop (a Numba CPU ``njit`` written
   here, independent of the library) over the three shape regimes, dtypes,
   flags, masks, ``cu_seqlens``, layouts, CuPy and PyTorch inputs, ``out=``,
   bit-identical repeats, non-default streams and the absence of host syncs;
2. times gaescan against a device-to-device copy of the same bytes (the
   roofline), the serial loop on CuPy and the published chunk-scan on CuPy,
   with CUDA events (median of several runs after warm-up).

Every check is wrapped: a failure prints ``FAIL`` with the error and the run
goes on; the exit status is non-zero if anything failed.  The whole run is
sized for a few minutes on an H200 (the first calls compile the kernels).
Options: ``--quick`` (small shapes only), ``--no-bench``, ``--no-check``,
``--budget SECONDS`` (benchmarks still pending past it are skipped),
``--check-budget SECONDS`` (the same for correctness checks).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

RESULTS: list[tuple[str, str, str]] = []  # (status, name, detail)
T0 = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - T0


CHECK_BUDGET = [170.0]  # seconds after which the remaining correctness checks are skipped


def check(name: str, fn: Callable[[], str | None]) -> None:
    if _elapsed() > CHECK_BUDGET[0]:
        RESULTS.append(("SKIP", name, "time budget"))
        print(f"SKIP  {name} (past the {CHECK_BUDGET[0]:.0f}s correctness budget)", flush=True)
        return
    t = time.perf_counter()
    try:
        detail = fn() or ""
        status = "PASS"
    except Exception as exc:  # noqa: BLE001 - report and continue
        status = "FAIL"
        tb = traceback.format_exc(limit=6).strip().splitlines()
        detail = f"{type(exc).__name__}: {exc}"
        print("      " + "\n      ".join(tb[-8:]))
    dt = time.perf_counter() - t
    RESULTS.append((status, name, detail))
    print(f"{status}  {name:<58s} {dt:6.2f}s  {detail}", flush=True)


# --------------------------------------------------------------------------- float64 oracle

_NJ: dict[str, Any] = {}


def _oracles() -> dict[str, Any]:
    if _NJ:
        return _NJ
    from numba import njit

    @njit(cache=False)
    def gae_ref(r, v, nv, g, lam, term, trunc, mask, has_next, lv, la, srow, slo, shi, adv, ret):
        for s in range(srow.shape[0]):
            row, lo, hi = srow[s], slo[s], shi[s]
            a_next = la[s]
            v_next = lv[s]
            for t in range(hi - 1, lo - 1, -1):
                if not mask[row, t]:
                    adv[row, t] = 0.0
                    ret[row, t] = 0.0
                    continue
                gt = g[row, t]
                vt = v[row, t]
                vn = nv[row, t] if has_next else v_next
                if term[row, t]:
                    d = r[row, t] - vt
                else:
                    d = r[row, t] + gt * vn - vt
                if term[row, t] or trunc[row, t]:
                    a = d
                else:
                    a = d + gt * lam[row, t] * a_next
                adv[row, t] = a
                ret[row, t] = a + vt
                a_next = a
                v_next = vt

    @njit(cache=False)
    def ret_ref(r, g, dones, mask, lv, srow, slo, shi, out):
        for s in range(srow.shape[0]):
            row, lo, hi = srow[s], slo[s], shi[s]
            G = lv[s]
            for t in range(hi - 1, lo - 1, -1):
                if not mask[row, t]:
                    out[row, t] = 0.0
                    continue
                if dones[row, t]:
                    G = r[row, t]
                else:
                    G = r[row, t] + g[row, t] * G
                out[row, t] = G

    @njit(cache=False)
    def scan_ref(a, b, reverse, init, out):
        R, T = b.shape
        for row in range(R):
            y = init[row]
            for i in range(T):
                t = T - 1 - i if reverse else i
                y = a[row, t] * y + b[row, t]
                out[row, t] = y

    _NJ.update(gae=gae_ref, ret=ret_ref, scan=scan_ref)
    return _NJ


def _h(x: Any) -> np.ndarray:
    """Host float64 / bool copy of a CuPy array, a torch tensor or a NumPy array."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get"):
        x = x.get()
    return np.asarray(x)


def _rows2d(x: np.ndarray, axis: int) -> np.ndarray:
    x = np.moveaxis(x, axis, -1)
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]))


def _full(c: Any, shape: tuple, out_dtype: Any, axis: int) -> np.ndarray:
    """A coefficient as a float64 (R, T) array, first rounded to the output dtype."""
    if np.isscalar(c):
        return np.full(_rt(shape, axis), float(np.dtype(out_dtype).type(c)))
    c = _h(c).astype(out_dtype).astype(np.float64)
    return _rows2d(np.broadcast_to(c, shape), axis)


def _rt(shape: tuple, axis: int) -> tuple:
    T = shape[axis]
    return (int(np.prod(shape)) // max(T, 1) if T else 0, T)


def _flag2(x: Any, shape: tuple, axis: int, default: bool) -> np.ndarray:
    if x is None:
        return np.full(_rt(shape, axis), default)
    return _rows2d(_h(x) != 0, axis)


def _seqs(R: int, T: int, cu: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if cu is None:
        return np.arange(R, dtype=np.int64), np.zeros(R, np.int64), np.full(R, T, np.int64)
    c = _h(cu).astype(np.int64)
    S = len(c) - 1
    return np.zeros(S, np.int64), c[:-1].copy(), c[1:].copy()


def _per_seq(x: Any, n: int, out_dtype: Any) -> np.ndarray:
    if x is None:
        return np.zeros(n)
    if np.isscalar(x):
        return np.full(n, float(np.dtype(out_dtype).type(x)))
    return _h(x).astype(out_dtype).astype(np.float64).reshape(-1)


def ref_gae(r, v, gamma, lam, *, out_dtype, next_values=None, last_value=None, dones=None,
            terminated=None, truncated=None, mask=None, cu_seqlens=None, axis=-1, last_advantage=None):
    shape = tuple(_h(r).shape)
    ax = axis % len(shape)
    R, T = _rt(shape, ax)
    rr = _rows2d(_h(r).astype(np.float64), ax)
    vv = _rows2d(_h(v).astype(np.float64), ax)
    nv = vv if next_values is None else _rows2d(_h(next_values).astype(np.float64), ax)
    term = _flag2(dones if dones is not None else terminated, shape, ax, False)
    trunc = _flag2(truncated, shape, ax, False)
    m = _flag2(mask, shape, ax, True)
    srow, slo, shi = _seqs(R, T, cu_seqlens)
    if last_value is None:
        lv = np.zeros(len(srow))
    elif np.isscalar(last_value):
        lv = np.full(len(srow), float(np.dtype(out_dtype).type(last_value)))
    else:
        lv = _h(last_value).astype(out_dtype).astype(np.float64).reshape(-1)
    adv = np.zeros((R, T))
    ret = np.zeros((R, T))
    _oracles()["gae"](rr, vv, nv, _full(gamma, shape, out_dtype, ax), _full(lam, shape, out_dtype, ax),
                      term, trunc, m, next_values is not None, lv, _per_seq(last_advantage, len(srow), out_dtype),
                      srow, slo, shi, adv, ret)
    return adv, ret


def ref_returns(r, gamma, *, out_dtype, dones=None, last_value=None, mask=None, cu_seqlens=None, axis=-1):
    shape = tuple(_h(r).shape)
    ax = axis % len(shape)
    R, T = _rt(shape, ax)
    rr = _rows2d(_h(r).astype(np.float64), ax)
    srow, slo, shi = _seqs(R, T, cu_seqlens)
    if last_value is None:
        lv = np.zeros(len(srow))
    elif np.isscalar(last_value):
        lv = np.full(len(srow), float(np.dtype(out_dtype).type(last_value)))
    else:
        lv = _h(last_value).astype(out_dtype).astype(np.float64).reshape(-1)
    out = np.zeros((R, T))
    _oracles()["ret"](rr, _full(gamma, shape, out_dtype, ax), _flag2(dones, shape, ax, False),
                      _flag2(mask, shape, ax, True), lv, srow, slo, shi, out)
    return out


def ref_scan(a, b, *, out_dtype, reverse=False, initial=None, axis=-1):
    shape = tuple(_h(b).shape)
    ax = axis % len(shape)
    R, T = _rt(shape, ax)
    bb = _rows2d(_h(b).astype(np.float64), ax)
    if initial is None:
        init = np.zeros(R)
    elif np.isscalar(initial):
        init = np.full(R, float(np.dtype(out_dtype).type(initial)))
    else:
        init = _h(initial).astype(out_dtype).astype(np.float64).reshape(-1)
    out = np.zeros((R, T))
    _oracles()["scan"](_full(a, shape, out_dtype, ax), bb, bool(reverse), init, out)
    return out


def compare(got: Any, want: np.ndarray, out_dtype: Any, axis: int = -1, mask: Any = None) -> str:
    g = _h(got)
    ax = axis % g.ndim
    g2 = _rows2d(g.astype(np.float64), ax)
    if g2.shape != want.shape:
        raise AssertionError(f"shape {g2.shape} != reference {want.shape}")
    if _h(got).dtype != np.dtype(out_dtype):
        raise AssertionError(f"dtype {_h(got).dtype} != {np.dtype(out_dtype)}")
    if mask is not None:
        m = _rows2d(_h(mask) != 0, ax)
        if np.any(g2[~m] != 0):
            raise AssertionError("non-zero output at a masked position")
    if not np.all(np.isfinite(g2)):
        raise AssertionError(f"{int(np.sum(~np.isfinite(g2)))} non-finite outputs")
    tol = 1e-12 if np.dtype(out_dtype) == np.float64 else 2e-5
    err = float(np.linalg.norm(g2 - want)) / max(float(np.linalg.norm(want)), 1e-300)
    if not err <= tol:
        i = np.unravel_index(np.argmax(np.abs(g2 - want)), want.shape)
        raise AssertionError(f"relative L2 error {err:.3g} > {tol} (worst at {i}: {g2[i]} vs {want[i]})")
    return f"rel.err {err:.1e}"


# --------------------------------------------------------------------------- correctness


def correctness(cp: Any, gaescan: Any, torch: Any, quick: bool) -> None:
    rng = np.random.default_rng(1234)

    def data(shape, dtype=np.float32, p_done=0.01):
        r = cp.asarray(rng.standard_normal(shape).astype(dtype))
        v = cp.asarray(rng.standard_normal(shape).astype(dtype))
        d = cp.asarray(rng.random(shape) < p_done)
        return r, v, d

    def gae_case(shape, dtype=np.float32, axis=-1, p_done=0.01, repeat=False, **kw):
        def run():
            r, v, d = data(shape, dtype, p_done)
            out_dt = np.float64 if dtype == np.float64 else np.float32
            args = dict(gamma=0.99, lam=0.95, dones=d, axis=axis, backend="cuda")
            args.update(kw)
            adv, ret = gaescan.gae(r, v, **args)
            msg = ""
            if repeat:
                adv2, ret2 = gaescan.gae(r, v, **args)
                cp.cuda.get_current_stream().synchronize()
                if not (_h(adv).tobytes() == _h(adv2).tobytes()
                        and _h(ret).tobytes() == _h(ret2).tobytes()):
                    raise AssertionError("repeat run is not bit-identical")
                msg = "bit-identical repeat; "
            refargs = {k: v_ for k, v_ in args.items() if k != "backend"}
            ea, er = ref_gae(r, v, out_dtype=out_dt, **refargs)
            m = kw.get("mask")
            return msg + compare(adv, ea, out_dt, axis, m) + " / " + compare(ret, er, out_dt, axis, m)
        return run

    N_LONG = 2**22 if not quick else 2**18
    # Regime: many rows.
    check("gae many rows B=512 T=300 f32 dones", gae_case((512, 300)))
    check("gae many rows B=2048 T=2000 f32 dones lv[B]",
          gae_case((2048, 2000), last_value=cp.asarray(rng.standard_normal(2048).astype(np.float32))))
    # Regime: few long rows (look-back), bit-identical repeat.
    check(f"gae few long rows B=4 T={N_LONG} f32 dones (repeat)", gae_case((4, N_LONG), repeat=True))
    check("gae long rows B=3 T=300001 f32 mask+gamma[B,1]+lam[B,T]+lv[B]",
          gae_case((3, 300001), mask=cp.asarray(rng.random((3, 300001)) < 0.7),
                   gamma=cp.asarray(rng.uniform(0.9, 1.0, (3, 1)).astype(np.float32)),
                   lam=cp.asarray(rng.uniform(0.8, 1.0, (3, 300001)).astype(np.float32)),
                   last_value=cp.asarray(rng.standard_normal(3).astype(np.float32))))
    check("gae single row T=1000003 f64 gamma=lam=1", gae_case((1000003,), np.float64, gamma=1.0, lam=1.0))
    # last_advantage (the carry-in of sequence-parallel slices): both drivers and packed.
    check("gae last_advantage[B] + lv[B], B=2048 T=2000 f32 (rows driver)",
          gae_case((2048, 2000), last_value=cp.asarray(rng.standard_normal(2048).astype(np.float32)),
                   last_advantage=cp.asarray(rng.standard_normal(2048).astype(np.float32))))
    check("gae last_advantage[B] B=3 T=300001 f32 mask, gamma=lam=1 (look-back driver)",
          gae_case((3, 300001), gamma=1.0, lam=1.0, mask=cp.asarray(rng.random((3, 300001)) < 0.7),
                   last_advantage=cp.asarray(rng.standard_normal(3).astype(np.float32))))

    # Packed cu_seqlens (empty, one-step and a giant segment), mask, per-segment last_value.
    def packed(dtype=np.float32, repeat=False, cu_dtype=np.int64):
        lens = rng.geometric(1 / 3000, size=300)
        lens[::17] = 0
        lens[5] = 1
        lens[100] = 400_000
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(cu_dtype)
        N = int(cu[-1])
        return gae_case((N,), dtype, cu_seqlens=cp.asarray(cu), repeat=repeat,
                        mask=cp.asarray(rng.random(N) < 0.9),
                        last_value=cp.asarray(rng.standard_normal(len(lens)).astype(dtype)),
                        last_advantage=cp.asarray(rng.standard_normal(len(lens)).astype(dtype)))
    check("gae packed cu_seqlens S=300 N~1.3M f32 mask lv[S] last_advantage[S] (repeat)", packed(repeat=True))
    check("gae packed cu_seqlens int32 offsets, f64", packed(np.float64, cu_dtype=np.int32))

    # Regime: many short rows.
    check("gae short rows B=65536 T=16 f32 dones", gae_case((65536, 16), p_done=0.1))
    check("gae short rows B=4000 T=1 f32", gae_case((4000, 1)))
    check("gae 3-D batch (8,64,700) axis=-1 f32", gae_case((8, 64, 700)))
    # Time-major layouts.
    check("gae time-major axis=0 T=4096 B=512 f32 dones lv[B]",
          gae_case((4096, 512), axis=0, last_value=cp.asarray(rng.standard_normal(512).astype(np.float32))))
    check("gae time-major axis=0 T=50000 B=8 f32", gae_case((50000, 8), axis=0))
    check("gae time-major axis=0 T=64 B=20000 f64", gae_case((64, 20000), np.float64, axis=0))
    # Dtypes.
    check("gae f16 inputs -> f32 B=64 T=5000", gae_case((64, 5000), np.float16))
    check("gae f64 B=64 T=50000", gae_case((64, 50000), np.float64))

    # terminated + truncated + next_values.
    def tt(dtype, shape):
        def run():
            r, v, _ = data(shape, dtype)
            nv = cp.asarray(rng.standard_normal(shape).astype(dtype))
            term = cp.asarray(rng.random(shape) < 0.005)
            trunc = cp.asarray((rng.random(shape) < 0.005).astype(np.uint8))
            out_dt = np.float64 if dtype == np.float64 else np.float32
            adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.9, next_values=nv, terminated=term,
                                   truncated=trunc, backend="cuda")
            ea, er = ref_gae(r, v, 0.99, 0.9, out_dtype=out_dt, next_values=nv,
                             terminated=term, truncated=trunc)
            return compare(adv, ea, out_dt) + " / " + compare(ret, er, out_dt)
        return run
    check("gae terminated+truncated(uint8)+next_values B=16 T=20000 f32", tt(np.float32, (16, 20000)))
    check("gae terminated+truncated+next_values B=2 T=2^20 f64", tt(np.float64, (2, 2**20)))

    # Look-back under real concurrency: force long walks (only every 16th tile publishes
    # its state) and force the block-per-row driver; both must match, bit for bit where
    # the geometry is the same.
    def walks():
        from gaescan.backends import cuda as cb

        r, v, d = data((4, 2**20))
        base = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
        with cb.override(debug_skip_incl=True):
            walk = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
        with cb.override(rows_min_blocks=1):
            rows_ = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
        if _h(base[0]).tobytes() != _h(walk[0]).tobytes():
            raise AssertionError("long look-back walks changed the bits")
        ea, _ = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
        return ("long walks bit-identical; " + compare(walk[0], ea, np.float32) + "; block-per-row "
                + compare(rows_[0], ea, np.float32))
    check("gae look-back long walks + block-per-row driver B=4 T=2^20", walks)

    # NaN isolation across a done.
    def nan_iso():
        r, v, _ = data((4, 100000))
        d = cp.zeros((4, 100000), dtype=cp.bool_)
        d[:, 49999] = True
        r[:, 70000] = cp.nan
        adv, _ = gaescan.gae(r, v, gamma=1.0, lam=1.0, dones=d, backend="cuda")
        a = _h(adv)
        if not np.all(np.isfinite(a[:, :50000])):
            raise AssertionError("a NaN crossed a done")
        return "NaN stayed in its episode"
    check("gae NaN does not cross a done (look-back regime)", nan_iso)

    # out= preallocated.
    def outs():
        r, v, d = data((256, 3000))
        a0 = cp.empty((256, 3000), cp.float32)
        r0 = cp.empty((256, 3000), cp.float32)
        res = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0), backend="cuda")
        if res[0] is not a0 or res[1] is not r0:
            raise AssertionError("out= arrays not returned")
        ea, er = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
        return compare(a0, ea, np.float32) + " / " + compare(r0, er, np.float32)
    check("gae out= preallocated B=256 T=3000", outs)

    # discounted_returns.
    def rets(shape, axis=-1, packed_=False):
        def run():
            if not packed_:
                r, _, d = data(shape, p_done=0.003)
                kw = dict(gamma=0.97, dones=d, axis=axis)
            else:
                lens = rng.geometric(1 / 2000, size=200)
                lens[::9] = 0
                cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
                r, _, d = data((int(cu[-1]),), p_done=0.003)
                kw = dict(gamma=0.97, dones=d, cu_seqlens=cp.asarray(cu),
                          last_value=cp.asarray(rng.standard_normal(200).astype(np.float32)),
                          mask=cp.asarray(rng.random(int(cu[-1])) < 0.8))
            G = gaescan.discounted_returns(r, backend="cuda", **kw)
            return compare(G, ref_returns(r, out_dtype=np.float32, **kw), np.float32, kw.get("axis", -1),
                           kw.get("mask"))
        return run
    check("discounted_returns B=1024 T=1000 dones", rets((1024, 1000)))
    check("discounted_returns B=2 T=2^21 dones", rets((2, 2**21)))
    check("discounted_returns time-major T=3000 B=700", rets((3000, 700), axis=0))
    check("discounted_returns packed mask lv[S]", rets(None, packed_=True))

    # linear_scan.
    def scans(shape, reverse, axis=-1, a_arr=False):
        def run():
            b = cp.asarray(rng.standard_normal(shape).astype(np.float32))
            a = cp.asarray(rng.uniform(0.5, 1.0, shape).astype(np.float32)) if a_arr else 0.999
            batch = tuple(n for i, n in enumerate(shape) if i != axis % len(shape))
            init = cp.asarray(rng.standard_normal(batch).astype(np.float32))
            y = gaescan.linear_scan(a, b, reverse=reverse, initial=init, axis=axis, backend="cuda")
            return compare(y, ref_scan(a, b, out_dtype=np.float32, reverse=reverse, initial=init, axis=axis),
                           np.float32, axis)
        return run
    check("linear_scan forward a[B,T] B=512 T=4000", scans((512, 4000), False, a_arr=True))
    check("linear_scan reverse a scalar B=3 T=2^21", scans((3, 2**21), True))
    check("linear_scan forward a scalar B=3 T=2^21", scans((3, 2**21), False))
    check("linear_scan forward time-major T=5000 B=300", scans((5000, 300), False, axis=0))

    # PyTorch inputs and streams.
    if torch is not None and torch.cuda.is_available():
        def torch_case():
            g = torch.Generator(device="cuda").manual_seed(0)
            r = torch.randn(64, 30000, device="cuda", generator=g)
            v = torch.randn(64, 30000, device="cuda", generator=g)
            d = torch.rand(64, 30000, device="cuda", generator=g) < 0.01
            adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
            if not isinstance(adv, torch.Tensor) or adv.device.type != "cuda":
                raise AssertionError(f"expected a CUDA tensor back, got {type(adv)}")
            ea, er = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
            return compare(adv, ea, np.float32) + " / " + compare(ret, er, np.float32)
        check("torch CUDA tensors B=64 T=30000 f32", torch_case)

        def torch_stream():
            s = torch.cuda.Stream()
            r = torch.randn(8, 2**20, device="cuda")
            v = torch.randn(8, 2**20, device="cuda")
            d = torch.rand(8, 2**20, device="cuda") < 0.001
            torch.cuda.current_stream().synchronize()
            with torch.cuda.stream(s):
                adv, _ = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
            s.synchronize()
            ea, _ = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
            return compare(adv, ea, np.float32)
        check("torch non-default stream B=8 T=2^20", torch_stream)

        def torch_packed(S):
            """``S`` packed sequences on the GPU: int32 offsets (as torch code has them), r, V, dones."""
            lens = rng.geometric(1 / 3000, size=S)
            cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
            N = int(lens.sum())
            return (cu, torch.randn(N, device="cuda"), torch.randn(N, device="cuda"),
                    torch.rand(N, device="cuda") < 0.001)

        def packed_err(cu, r, v, d, adv, ret):
            ea, er = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d, cu_seqlens=cu)
            return compare(adv, ea, np.float32) + " / " + compare(ret, er, np.float32)

        def torch_stream_prep():
            # int32 offsets are copied to int64 and the outputs allocated before the launch:
            # all on the caller's stream, or the kernel (on torch's non-blocking side stream)
            # could read the offsets before the copy has run.  CuPy's default stream is kept
            # busy meanwhile, so work queued there would land late.
            cu, r, v, d = torch_packed(400)
            big = cp.ones(2**28, dtype=cp.float32)  # 1 GiB
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            with cp.cuda.Stream.null:
                for _ in range(60):  # ~60 x 0.5 ms queued on CuPy's default stream
                    big *= 1.0000001
            with torch.cuda.stream(s):
                adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, cu_seqlens=cu, backend="cuda")
                adv, ret = adv.clone(), ret.clone()  # on s: what the kernel wrote, before anything else
            s.synchronize()
            torch.cuda.synchronize()
            del big
            return packed_err(cu, r, v, d, adv, ret)
        check("torch side stream, int32 cu_seqlens, CuPy's default stream busy", torch_stream_prep)

        def torch_time_major():
            r = torch.randn(3000, 256, device="cuda", dtype=torch.float64)
            v = torch.randn(3000, 256, device="cuda", dtype=torch.float64)
            d = torch.rand(3000, 256, device="cuda") < 0.01
            adv, _ = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=0, backend="cuda")
            ea, _ = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float64, dones=d, axis=0)
            return compare(adv, ea, np.float64, 0)
        check("torch time-major axis=0 f64 T=3000 B=256", torch_time_major)
    else:
        print("SKIP  torch checks (torch with CUDA not available)")

    def cupy_stream():
        r, v, d = data((8, 2**20), p_done=0.001)
        cp.cuda.get_current_stream().synchronize()
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
        s.synchronize()
        ea, _ = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
        return compare(adv, ea, np.float32)
    check("cupy non-default stream B=8 T=2^20", cupy_stream)

    def no_host_sync():
        B, T = 4, 2**22
        r, v, d = data((B, T))
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")  # warm (compiled)
        big = cp.ones(2**28, dtype=cp.float32)  # 1 GiB
        s = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device().synchronize()
        with s:
            ev0 = cp.cuda.Event()
            ev0.record()
            for _ in range(60):  # ~60 x 0.5 ms of queued work
                big *= 1.0000001
            t = time.perf_counter()
            gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
            host_ms = (time.perf_counter() - t) * 1e3
            pending = not s.done
            ev1 = cp.cuda.Event()
            ev1.record()
        ev1.synchronize()
        queued_ms = cp.cuda.get_elapsed_time(ev0, ev1)
        del big
        if not pending:
            raise AssertionError(f"stream already idle when the call returned (call took {host_ms:.2f} ms "
                                 f"host time, queued work {queued_ms:.1f} ms): a host sync?")
        if host_ms > 0.5 * queued_ms:
            raise AssertionError(f"call took {host_ms:.2f} ms host time behind {queued_ms:.1f} ms of queued work")
        return f"call returned after {host_ms:.2f} ms with {queued_ms:.1f} ms of work queued; stream still busy"
    check("no host synchronisation (queued work, streamQuery)", no_host_sync)

    # CUDA graphs: the look-back scratch (and any conversion) of a captured call must
    # outlive the call, since the graph replays with the addresses it captured.
    JUNK = 0x7F7F7F7F

    def churn(stream):
        """Arrays allocated on ``stream`` after a capture: what its freed memory would go to.

        CuPy's pool hands a freed block out again only on the stream that freed it.
        """
        with stream:
            junk = [cp.full(n, JUNK, dtype=cp.uint32) for n in (1 << 12, 1 << 16, 1 << 20) for _ in range(4)]
            stream.synchronize()
        return junk

    def intact(junk):
        if not all(bool((j == JUNK).all()) for j in junk):
            raise AssertionError("a replay wrote into memory the pool handed out after the capture")
        return "arrays allocated after the capture intact"

    def graph_cupy():
        B, T = 4, 2**20
        r, v, d = data((B, T))
        adv = cp.empty((B, T), cp.float32)
        ret = cp.empty((B, T), cp.float32)
        s = cp.cuda.Stream(non_blocking=True)
        args = dict(gamma=0.99, lam=0.95, dones=d, out=(adv, ret), backend="cuda")
        cp.cuda.Device().synchronize()
        with s:
            gaescan.gae(r, v, **args)  # compiled, and the pool holds this stream's blocks
            s.synchronize()
            s.begin_capture()
            gaescan.gae(r, v, **args)
            graph = s.end_capture()
        junk = churn(s)
        msgs = []
        for _ in range(2):  # new inputs in the same arrays, every replay
            with s:
                r[...] = cp.asarray(rng.standard_normal((B, T)).astype(np.float32))
                adv.fill(np.nan)
                graph.launch(s)
            s.synchronize()
            ea, er = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
            msgs.append(compare(adv, ea, np.float32) + " / " + compare(ret, er, np.float32))
        return "look-back captured, replayed twice: " + "; ".join(msgs) + "; " + intact(junk)
    check("CUDA graph (CuPy capture) gae look-back B=4 T=2^20 out=", graph_cupy)

    if torch is not None and torch.cuda.is_available():
        def graph_torch():
            # PyTorch's recipe as documented: warm up on a side stream, then capture with
            # torch.cuda.graph's defaults (its own stream, "global" capture mode).
            cu, r, v, d = torch_packed(300)
            N = r.shape[0]
            adv = torch.empty(N, device="cuda")
            ret = torch.empty(N, device="cuda")
            args = dict(gamma=0.99, lam=0.95, dones=d, cu_seqlens=cu, out=(adv, ret), backend="cuda")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                gaescan.gae(r, v, **args)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                capture_stream = torch.cuda.current_stream().cuda_stream
                gaescan.gae(r, v, **args)  # int32 offsets: a conversion copy inside the graph
            junk = churn(cp.cuda.ExternalStream(capture_stream))
            r.copy_(torch.randn(N, device="cuda"))
            adv.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            return packed_err(cu, r, v, d, adv, ret) + "; " + intact(junk)
        check("CUDA graph (torch.cuda.graph) packed int32 cu_seqlens out=", graph_torch)

    # The lean path of the commonest call (C-contiguous CuPy, scalars) against the general path.
    def lean_vs_general():
        import gaescan._api as api

        r, v, d = data((64, 5000))
        a1, r1 = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=0.5, backend="cuda")
        real = api._gae_device_fast
        api._gae_device_fast = lambda *a: None
        try:
            a2, r2 = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=0.5, backend="cuda")
        finally:
            api._gae_device_fast = real
        if not (_h(a1).tobytes() == _h(a2).tobytes() and _h(r1).tobytes() == _h(r2).tobytes()):
            raise AssertionError("the lean and general paths differ")
        return "bit-identical"
    check("gae lean path == general path B=64 T=5000 f32 dones", lean_vs_general)

    # The experimental direct launch (tunable "direct_launch"): same kernels, same stream.
    from gaescan.backends import cuda as cb

    def variant(case, **tun):
        """``case`` with CUDA tunables overridden."""
        def run():
            with cb.override(**tun):
                return case()
        return run

    def direct(case):
        return variant(case, direct_launch=True)
    check("direct launch: gae many rows B=512 T=300 f32 dones", direct(gae_case((512, 300))))
    check("direct launch: gae few long rows B=4 T=2^20 f32 dones (repeat)",
          direct(gae_case((4, 2**20), repeat=True)))
    check("direct launch: packed f32 mask lv[S]", direct(packed()))
    check("direct launch: cupy non-default stream B=8 T=2^20", direct(cupy_stream))
    check("direct launch: no host synchronisation", direct(no_host_sync))

    # The experimental raw launch (tunable "raw_launch"): parameters packed in Python,
    # cuLaunchKernel through CuPy.  Every dtype and option changes the parameter list.
    def raw(case):
        return variant(case, raw_launch=True)
    check("raw launch: gae many rows B=512 T=300 f32 dones", raw(gae_case((512, 300))))
    check("raw launch: gae few long rows B=4 T=2^20 f32 dones (repeat)",
          raw(gae_case((4, 2**20), repeat=True)))
    check("raw launch: gae f64 time-major axis=0 T=3000 B=256",
          raw(gae_case((3000, 256), np.float64, axis=0)))
    check("raw launch: gae f16 inputs B=64 T=5000", raw(gae_case((64, 5000), np.float16)))
    check("raw launch: packed f32 mask lv[S]", raw(packed()))
    check("raw launch: terminated+truncated+next_values B=16 T=20000", raw(tt(np.float32, (16, 20000))))
    check("raw launch: discounted_returns B=1024 T=1000", raw(rets((1024, 1000))))
    check("raw launch: linear_scan forward a[B,T] B=512 T=4000", raw(scans((512, 4000), False, a_arr=True)))
    check("raw launch: cupy non-default stream B=8 T=2^20", raw(cupy_stream))
    check("raw launch: no host synchronisation", raw(no_host_sync))
    if torch is not None and torch.cuda.is_available():
        check("raw launch: torch non-default stream B=8 T=2^20", raw(torch_stream))

    # The experimental kernel variants (tunables "prefetch", "fast_lookback", "contiguous_typing",
    # "coalesced_loads").
    pf = dict(prefetch=True, rows_min_blocks=1)
    check("prefetch: gae rows B=512 T=3000 f32 dones (3 tiles per row, repeat)",
          variant(gae_case((512, 3000), repeat=True), **pf))
    check("prefetch: gae rows B=256 T=131072 f32 dones, threads=256",
          variant(gae_case((256, 131072)), threads=256, **pf))
    check("prefetch: gae rows f16 inputs B=64 T=5000", variant(gae_case((64, 5000), np.float16), **pf))
    check("prefetch: gae rows f64 B=64 T=50000", variant(gae_case((64, 50000), np.float64), **pf))
    check("prefetch: packed f32 mask lv[S] (one row)", variant(packed(), **pf))
    check("prefetch: terminated+truncated+next_values B=16 T=20000", variant(tt(np.float32, (16, 20000)), **pf))
    check("prefetch: discounted_returns B=1024 T=1000", variant(rets((1024, 1000)), **pf))
    check("prefetch: linear_scan forward a[B,T] B=512 T=4000", variant(scans((512, 4000), False, a_arr=True), **pf))
    fl = dict(fast_lookback=True)
    check(f"fast look-back: gae B=4 T={N_LONG} f32 dones (repeat)", variant(gae_case((4, N_LONG), repeat=True), **fl))
    check("fast look-back: gae B=256 T=131072 f32 dones, threads=256",
          variant(gae_case((256, 131072)), threads=256, **fl))
    check("fast look-back: gae f16 inputs B=4 T=2^20", variant(gae_case((4, 2**20), np.float16), **fl))
    check("fast look-back: terminated+truncated+next_values B=2 T=2^20",
          variant(tt(np.float32, (2, 2**20)), **fl))
    check("fast look-back: discounted_returns B=2 T=2^21", variant(rets((2, 2**21)), **fl))
    check("fast look-back: discounted_returns packed mask lv[S]", variant(rets(None, packed_=True), **fl))
    check("fast look-back: linear_scan forward B=3 T=2^21", variant(scans((3, 2**21), False), **fl))
    check("fast look-back: linear_scan reverse B=3 T=2^21", variant(scans((3, 2**21), True), **fl))
    ct = dict(contiguous_typing=True)
    check(f"contiguous typing + fast look-back: gae B=4 T={N_LONG} f32 dones (repeat)",
          variant(gae_case((4, N_LONG), repeat=True), **ct, **fl))
    check("contiguous typing: gae many rows B=2048 T=2000 f32 dones lv[B]",
          variant(gae_case((2048, 2000), last_value=cp.asarray(rng.standard_normal(2048).astype(np.float32))), **ct))
    check("contiguous typing: gae time-major axis=0 T=4096 B=512 (strided: the A kernel)",
          variant(gae_case((4096, 512), axis=0), **ct))
    check("contiguous typing + prefetch: gae rows f16 inputs B=64 T=5000",
          variant(gae_case((64, 5000), np.float16), **ct, **pf))

    cl = dict(coalesced_loads=True)
    check(f"coalesced loads: gae few long rows B=4 T={N_LONG} f32 dones (repeat)",
          variant(gae_case((4, N_LONG), repeat=True), **cl))
    check(f"coalesced loads + fast look-back: gae B=4 T={N_LONG} f32 dones (repeat)",
          variant(gae_case((4, N_LONG), repeat=True), **cl, **fl))
    check("coalesced loads: gae rows B=2048 T=2000 f16 inputs",
          variant(gae_case((2048, 2000), np.float16), **cl))
    check("coalesced loads: gae rows f64 B=64 T=50000", variant(gae_case((64, 50000), np.float64), **cl))
    check("coalesced loads: gae time-major axis=0 T=4096 B=8 (4 rows per warp)",
          variant(gae_case((4096, 8), axis=0), **cl))
    check("coalesced loads: packed f32 mask lv[S]", variant(packed(), **cl))
    check("coalesced loads: terminated+truncated+next_values B=16 T=20000",
          variant(tt(np.float32, (16, 20000)), **cl))
    check("coalesced loads: discounted_returns B=1024 T=1000", variant(rets((1024, 1000)), **cl))
    check("coalesced loads + fast look-back: linear_scan forward a[B,T] B=3 T=2^21",
          variant(scans((3, 2**21), False, a_arr=True), **cl, **fl))

    sh = dict(shared_steps=True)
    check(f"shared steps: gae few long rows B=4 T={N_LONG} f32 dones (repeat)",
          variant(gae_case((4, N_LONG), repeat=True), **sh))
    check(f"shared steps + fast look-back, k=16: gae B=4 T={N_LONG} f32 dones (repeat)",
          variant(gae_case((4, N_LONG), repeat=True), k=16, **sh, **fl))
    check("shared steps + fast look-back: gae B=256 T=131072 f32 dones",
          variant(gae_case((256, 131072)), **sh, **fl))
    check("shared steps: gae rows B=2048 T=2000 f16 inputs",
          variant(gae_case((2048, 2000), np.float16), **sh))
    check("shared steps: gae rows f64 B=64 T=50000", variant(gae_case((64, 50000), np.float64), **sh))
    check("shared steps: gae rows B=2048 T=2000 f32 mask",
          variant(gae_case((2048, 2000), mask=cp.asarray(rng.random((2048, 2000)) < 0.8)), **sh))
    check("shared steps: gae time-major axis=0 T=8192 B=512 (one time-thread per warp)",
          variant(gae_case((8192, 512), axis=0), **sh))
    check("shared steps: gae time-major axis=0 T=4096 B=8 (4 rows per warp)",
          variant(gae_case((4096, 8), axis=0), **sh))
    check("shared steps: gae long rows B=3 T=300001 f32 mask+gamma[B,1]+lam[B,T]+lv[B]",
          variant(gae_case((3, 300001), mask=cp.asarray(rng.random((3, 300001)) < 0.7),
                           gamma=cp.asarray(rng.uniform(0.9, 1.0, (3, 1)).astype(np.float32)),
                           lam=cp.asarray(rng.uniform(0.8, 1.0, (3, 300001)).astype(np.float32)),
                           last_value=cp.asarray(rng.standard_normal(3).astype(np.float32))), **sh))
    check("shared steps: packed f32 mask lv[S]", variant(packed(), **sh))
    check("shared steps + fast look-back: discounted_returns packed mask lv[S]",
          variant(rets(None, packed_=True), **sh, **fl))
    check("shared steps: terminated+truncated+next_values B=16 T=20000",
          variant(tt(np.float32, (16, 20000)), **sh))
    check("shared steps: discounted_returns B=1024 T=1000", variant(rets((1024, 1000)), **sh))
    check("shared steps + fast look-back: discounted_returns B=2 T=2^21",
          variant(rets((2, 2**21)), **sh, **fl))
    check("shared steps + fast look-back: linear_scan forward a[B,T] B=3 T=2^21",
          variant(scans((3, 2**21), False, a_arr=True), **sh, **fl))
    check("shared steps: linear_scan reverse B=512 T=4000", variant(scans((512, 4000), True), **sh))

    def fast_vs_general():
        lens = rng.geometric(1 / 5000, size=200)
        cu = cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        N = int(lens.sum())
        rp, vp, dp = data((N,))
        r4, v4, d4 = data((8, 2**20))
        out = []
        for tun in (dict(), fl, dict(fl, debug_skip_incl=True), dict(fl, **cl), cl, sh, dict(fl, **sh)):
            with cb.override(**tun):
                a, _ = gaescan.gae(r4, v4, gamma=0.99, lam=0.95, dones=d4, backend="cuda")
                ap, _ = gaescan.gae(rp, vp, gamma=0.99, lam=0.95, dones=dp, cu_seqlens=cu, backend="cuda")
            out.append(_h(a).tobytes() + _h(ap).tobytes())
        if any(o != out[0] for o in out):
            raise AssertionError("the fast look-back (its long walks, coalesced loads or shared steps) "
                                 "changed the bits")
        return ("bit-identical to the general look-back, also with long walks, coalesced loads and "
                "shared steps; rows and packed")
    check("fast look-back, coalesced loads, shared steps == general look-back, B=8 T=2^20, packed S=200",
          fast_vs_general)


# --------------------------------------------------------------------------- timing


def _events_ms(cp: Any, fn: Callable[[], Any], reps: int = 10, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    s = cp.cuda.get_current_stream()
    times = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        fn()
        e1.record(s)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return statistics.median(times)


def _host_us(cp: Any, fn: Callable[[], Any], calls: int = 200) -> float:
    """Host time per call, in µs, of back-to-back calls (no sync in between)."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    cp.cuda.get_current_stream().synchronize()
    return us


def _copy_ms(cp: Any, n: int) -> float:
    """Median time of a device-to-device copy moving GAE's 17 bytes per step for ``n`` steps (the roofline).

    A copy of X bytes moves 2X (read and write): X = 17n/2.
    """
    nbytes = (17 * n) // 2
    src = cp.empty(nbytes, cp.uint8)
    dst = cp.empty(nbytes, cp.uint8)
    sp = cp.cuda.get_current_stream().ptr
    return _events_ms(cp, lambda: cp.cuda.runtime.memcpyAsync(
        dst.data.ptr, src.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, sp))


def _gae_arrays(cp: Any, rng: Any, shape: tuple, p_done: float) -> tuple:
    """Float32 rewards, values, boolean dones (probability ``p_done``) and two float32 outputs."""
    r = cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    v = cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    d = cp.asarray(rng.random(shape) < p_done)
    return r, v, d, cp.empty(shape, cp.float32), cp.empty(shape, cp.float32)


def _local_chunk_scan(cp: Any, r: Any, v: Any, gamma: float, lam: float, C: int = 256) -> Any:
    """C x C kernel-matmul chunk scan, constant gamma*lam, no dones; carries by the same trick, recursively."""
    dt = r.dtype
    B, T = r.shape
    vn = cp.concatenate([v[:, 1:], cp.zeros((B, 1), dt)], axis=1)
    delta = r + dt.type(gamma) * vn - v
    return _rev_discount(cp, delta, dt.type(gamma) * dt.type(lam), C)


def _rev_discount(cp: Any, x: Any, c: Any, C: int) -> Any:
    dt = x.dtype
    B, T = x.shape
    if T <= 1:
        return x.copy()
    n = -(-T // C)
    if n * C != T:
        x = cp.concatenate([x, cp.zeros((B, n * C - T), dt)], axis=1)
    i = cp.arange(C)
    e = i[None, :] - i[:, None]
    K = cp.where(e >= 0, c ** cp.maximum(e, 0).astype(dt), dt.type(0)).astype(dt)
    local = x.reshape(B, n, C) @ K.T
    if n > 1:
        heads = local[:, :, 0]
        z = _rev_discount(cp, heads, dt.type(c) ** C, C)  # z_k = sum from chunk k to the end
        nxt = cp.concatenate([z[:, 1:], cp.zeros((B, 1), dt)], axis=1)
        decay = (dt.type(c) ** cp.arange(C, 0, -1).astype(dt)).astype(dt)
        local = local + nxt[:, :, None] * decay[None, None, :]
    return local.reshape(B, n * C)[:, :T]


def benchmarks(cp: Any, gaescan: Any, quick: bool, budget: float) -> None:
    try:
        from gaescan.bench import baselines
    except Exception:  # noqa: BLE001
        baselines = None
    rng = np.random.default_rng(7)
    shapes = [("B=256 T=131072", 256, 131072, -1), ("B=4 T=2^22", 4, 2**22, -1),
              ("B=8 T=1024", 8, 1024, -1), ("B=4096 T=256", 4096, 256, -1),
              ("time-major T=8192 B=4096", 4096, 8192, 0)]
    if quick:
        shapes = [("B=64 T=16384", 64, 16384, -1), ("B=8 T=1024", 8, 1024, -1)]
    def one(row: dict, B: int, T: int, axis: int) -> None:
        shp = (B, T) if axis == -1 else (T, B)
        r, v, d, a0, r0 = _gae_arrays(cp, rng, shp, 0.001)
        n = B * T

        def f():
            return gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, out=(a0, r0), backend="cuda")

        t_g = _events_ms(cp, f)
        row["gaescan ms"] = t_g
        row["GB/s"] = 17 * n / t_g / 1e6
        t_c = _copy_ms(cp, n)
        row["copy ms"] = t_c
        row["copy GB/s"] = 17 * n / t_c / 1e6
        row["frac"] = t_c / t_g
        if B * T <= 2**20:  # small problems are host-bound
            from gaescan.backends import cuda as cb

            row["host us/call"] = _host_us(cp, f)
            with cb.override(direct_launch=True):
                row["host us direct"] = _host_us(cp, f)
            try:  # experimental: a failure here must not cost the row its other figures
                with cb.override(raw_launch=True):
                    row["host us raw"] = _host_us(cp, f)
            except Exception as exc:  # noqa: BLE001
                row["host us raw"] = f"n/a ({type(exc).__name__})"
                RESULTS.append(("FAIL", "raw launch host timing", f"{type(exc).__name__}: {exc}"))
        rr, vv, dd = (x if axis == -1 else x.T for x in (r, v, d))
        if baselines is not None:  # serial loop on CuPy, capped and extrapolated
            Tc = min(T, 4096 if not quick else 1024)
            t_s = _events_ms(cp, lambda: baselines.serial_gae(cp, rr[:, :Tc], vv[:, :Tc], 0.99, 0.95,
                                                              dd[:, :Tc]), reps=2, warm=1)
            row["serial ms"] = t_s * T / Tc
            row["serial note"] = "" if Tc == T else f"T capped at {Tc}, time per step extrapolated to T={T}"
        if _elapsed() < budget:
            try:
                row["numpy-backend ms"] = _events_ms(cp, lambda: gaescan.gae(
                    r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, backend="numpy"), reps=2, warm=1)
            except Exception as exc:  # noqa: BLE001
                row["numpy-backend ms"] = f"n/a ({type(exc).__name__})"
            try:
                row["CxC chunk ms"] = _events_ms(cp, lambda: _local_chunk_scan(cp, rr, vv, 0.99, 0.95),
                                                 reps=2, warm=1)
            except Exception as exc:  # noqa: BLE001
                row["CxC chunk ms"] = f"n/a ({type(exc).__name__}: {exc})"
            if baselines is not None and T <= 2**17:
                try:
                    row["published chunk ms"] = _events_ms(
                        cp, lambda: baselines.chunk_scan_gae(cp, rr, vv, 0.99, 0.95), reps=2, warm=1)
                except Exception as exc:  # noqa: BLE001
                    row["published chunk ms"] = f"n/a ({type(exc).__name__})"

    rows = []
    for label, B, T, axis in shapes:
        if _elapsed() > budget:
            print(f"SKIP  bench {label}: past the {budget:.0f}s budget")
            continue
        row = {"shape": label}
        try:
            one(row, B, T, axis)
            RESULTS.append(("PASS", f"bench {label}", ""))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc(limit=4)
            RESULTS.append(("FAIL", f"bench {label}", f"{type(exc).__name__}: {exc}"))
            print(f"FAIL  bench {label}: {type(exc).__name__}: {exc}")
        rows.append(row)
        cp.get_default_memory_pool().free_all_blocks()

    def fmt(x):
        if isinstance(x, float):
            return f"{x:10.3f}" if x < 1e4 else f"{x:10.0f}"
        return f"{x!s:>10}" if x is not None else f"{'-':>10}"

    cols = ["gaescan ms", "GB/s", "copy ms", "copy GB/s", "frac", "host us/call", "host us direct",
            "host us raw", "serial ms", "numpy-backend ms", "CxC chunk ms", "published chunk ms"]
    heads = ["cuda ms", "GB/s", "copy ms", "copy GB/s", "frac", "host us", "host direct", "host raw",
             "serial ms", "numpy-bk ms", "CxC ms", "publ. ms"]
    print()
    print("GAE float32 with dones (17 bytes/step: 4 r + 4 V + 1 done read, 4 adv + 4 ret written).")
    print("copy = cudaMemcpyAsync device-to-device of 17N/2 bytes (17N bytes of traffic) = the roofline;")
    print("frac = copy time / gaescan time.  serial = CuPy loop over time (vectorised over batch).")
    print("CxC chunk = local C=256 kernel-matmul chunk scan (constant gamma*lam, NO dones: not the same")
    print("problem, a speed reference).  published chunk = gaescan.bench.baselines.chunk_scan_gae (no dones).")
    print("numpy-bk = gaescan.gae(..., backend='numpy') on the same CuPy arrays (with dones).")
    print("host us = host time per call of back-to-back small calls; host direct / host raw = the same")
    print("with the experimental direct_launch (no Numba launch configuration per call) / raw_launch")
    print("(parameters packed in Python, cuLaunchKernel through CuPy) tunables.")
    print(f"{'shape':<26s}" + "".join(f"{h:>11s}" for h in heads))
    for row in rows:
        print(f"{row['shape']:<26s}" + "".join(" " + fmt(row.get(c)) for c in cols))
        if row.get("serial note"):
            print(f"{'':<26s} serial: {row['serial note']}")
    try:
        from gaescan.backends import cuda as cb

        print("launch plans:")
        for label, B, T, axis in shapes:
            pl = cb.plan(B, T, np.float32, time_major=axis == 0)
            print(f"  {label:<26s} {({k: v for k, v in pl.items() if k != 'opts'})}")
    except Exception as exc:  # noqa: BLE001
        print(f"(no launch plans: {exc})")
    try:
        access_probe(cp, quick)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc(limit=4)
        RESULTS.append(("FAIL", "access-pattern probe", f"{type(exc).__name__}: {exc}"))
    sweep(cp, gaescan, quick, budget)


def access_probe(cp: Any, quick: bool) -> None:
    """GAE's 17 bytes per step moved by elementwise kernels (no scan): the access pattern's own cost."""
    from gaescan.backends import cuda as cb
    from gaescan.bench import _probe

    n = 2**25 if not quick else 2**20
    rng = np.random.default_rng(5)
    r, v, d, o1, o2 = _gae_arrays(cp, rng, (n,), 0.001)
    args = [cb._device_view(x) for x in (r, v, d, o1, o2)]
    stream = cb._stream(cb.current_stream_ptr())
    t_copy = _copy_ms(cp, n)
    print()
    print(f"access-pattern probe: r, v, done in, two float32 out (17 bytes/step), N=2^{n.bit_length() - 1}, "
          "elementwise (no scan); frac = copy time / probe time")
    print(f"  {'D2D copy of the same bytes':<40s} {t_copy:8.3f} ms {17 * n / t_copy / 1e6:7.0f} GB/s")
    probes = [("coalesced, one thread per step", "coalesced", 8, 0), ("coalesced, grid-stride 16 blocks/SM",
              "coalesced", 8, 16), ("owned K=4 consecutive steps per thread", "owned", 4, 0),
              ("owned K=8 (the scan kernels' default)", "owned", 8, 0), ("owned K=16", "owned", 16, 0)]
    want1 = _h(r[:4096]) - _h(v[:4096])
    want2 = np.where(_h(d[:4096]), _h(r[:4096]), want1 + _h(v[:4096]))
    for label, which, K, bps in probes:
        o1.fill(np.nan)
        t = _events_ms(cp, lambda which=which, K=K, bps=bps: _probe.launch(
            which, *args, K=K, stream=stream, blocks_per_sm=bps))
        ok = np.array_equal(_h(o1[:4096]), want1) and np.array_equal(_h(o2[:4096]), want2) \
            and bool(cp.all(cp.isfinite(o1)))
        print(f"  {label:<40s} {t:8.3f} ms {17 * n / t / 1e6:7.0f} GB/s  frac {t_copy / t:.2f}"
              f"{'' if ok else '  WRONG OUTPUT'}")
        if not ok:
            RESULTS.append(("FAIL", f"access-pattern probe {label}", "wrong output"))


def sweep_shapes(quick: bool = False) -> list[tuple[str, int, int, list[dict]]]:
    """The sweep's shapes and, per shape, the CUDA tunable settings it times, most telling first.

    Each item is ``(label, B, T, settings)``; a setting is a dict for
    :func:`gaescan.backends.cuda.override`.  A sweep past its budget is cut short,
    so the order matters.
    """
    base = dict(threads=128, k=8)
    fast = dict(fast_lookback=True)
    rows = dict(rows_min_blocks=1)  # a block per row walking its tiles, no look-back
    pf = dict(rows, prefetch=True)
    # Prefetching takes 166 registers: min_blocks_per_sm=2 caps them at 128 (88 B of
    # spills) so two blocks of 256 threads share an SM; more than 256 threads get that
    # cap anyway.  min_blocks_per_sm=6 at 128 threads caps at 85 registers (ptxas used 80).
    ct = dict(contiguous_typing=True)  # layout-"C" kernels: 96 registers instead of 111 (look-back)
    cl = dict(coalesced_loads=True)  # loads coalesced through shared memory, as the stores are
    # Steps kept in shared memory: GAE look-back 111 -> 78 registers (fast, layout C: 72),
    # so 6-7 blocks of 128 per SM instead of 4-5, and the same registers at k=16; with
    # min_blocks_per_sm=8, 64 registers and no spills (k=8; k=16 with layout C).
    sh = dict(shared_steps=True)
    sh8 = dict(shared_steps=True, min_blocks_per_sm=8)
    b256 = [base, dict(base, **fast), dict(base, **sh), dict(base, **fast, **sh), dict(base, **fast, **sh8),
            dict(threads=128, k=16, **fast, **ct, **sh8), dict(base, **fast, **ct, **sh8),
            dict(base, **fast, **ct, **sh), dict(threads=128, k=16, **fast, **sh),
            dict(threads=128, k=16, **fast, **ct, **sh), dict(threads=256, k=8, **fast, **sh),
            dict(threads=128, k=16, **sh),
            dict(base, **fast, **ct), dict(base, **fast, **cl),
            dict(base, **fast, **ct, **cl), dict(base, **cl), dict(base, **rows), dict(base, **rows, **cl),
            dict(base, **pf), dict(base, **pf, **ct), dict(threads=256, k=8, **rows, **cl),
            dict(threads=256, k=8, **rows), dict(threads=256, k=8, **pf),
            dict(threads=256, k=8, min_blocks_per_sm=2, **pf), dict(threads=256, k=8, **fast),
            dict(threads=512, k=8, **rows), dict(threads=512, k=8, **pf), dict(threads=512, k=4, **pf),
            dict(threads=128, k=16, **fast), dict(threads=256, k=16, **fast), dict(threads=256, k=16, **rows),
            dict(base, min_blocks_per_sm=6, **fast),
            dict(threads=128, k=4), dict(threads=256, k=8), dict(threads=128, k=16), dict(threads=256, k=4),
            dict(threads=512, k=4), dict(base, min_blocks_per_sm=6)]
    b4 = [base, dict(base, **fast), dict(base, **sh), dict(base, **fast, **sh), dict(base, **fast, **sh8),
          dict(threads=128, k=16, **fast, **ct, **sh8), dict(base, **fast, **ct, **sh8),
          dict(base, **fast, **ct, **sh), dict(threads=128, k=16, **fast, **sh),
          dict(threads=256, k=16, **fast, **sh),
          dict(threads=256, k=8, **fast, **sh), dict(base, **fast, **ct), dict(base, **fast, **cl),
          dict(base, **fast, **ct, **cl),
          dict(base, **cl), dict(base, **ct), dict(threads=128, k=16, **fast, **cl),
          dict(threads=256, k=8, **fast), dict(threads=128, k=16, **fast), dict(threads=128, k=16, **fast, **ct),
          dict(threads=256, k=16, **fast), dict(base, min_blocks_per_sm=6, **fast),
          dict(threads=256, k=8), dict(threads=128, k=16), dict(threads=128, k=4), dict(threads=256, k=4),
          dict(threads=512, k=4), dict(base, min_blocks_per_sm=6)]
    # 1024 rows walk their tiles by default
    b1024 = [base, dict(base, **sh), dict(base, **sh8), dict(threads=256, k=8, **sh),
             dict(threads=128, k=16, **sh),
             dict(base, prefetch=True), dict(base, **cl), dict(threads=256, k=8, prefetch=True),
             dict(threads=256, k=8, **cl), dict(threads=256, k=8, prefetch=True, min_blocks_per_sm=2)]
    if quick:
        return [("B=64 T=16384", 64, 16384, b4[:2])]
    return [("B=256 T=131072", 256, 131072, b256), ("B=4 T=2^22", 4, 2**22, b4),
            ("B=1024 T=32768", 1024, 32768, b1024)]


def blocks_per_sm(regs: int, smem: int, threads: int, props: dict | None = None) -> int:
    """Blocks of ``threads`` that can be resident on one SM at once, from the kernel's resources.

    The CUDA occupancy rules: registers are allocated per warp in units of 256,
    every block also takes the per-block reserved shared memory, and threads and
    blocks per SM are capped.  ``props`` holds the device's limits (CuPy's
    ``getDeviceProperties`` keys); missing ones default to an H100/H200's.
    """
    p = props or {}
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = int(p.get("regsPerMultiprocessor", 65536)) // per_warp // warps if per_warp else 1 << 30
    reserved = int(p.get("reservedSharedMemPerBlock", 1024))
    by_smem = int(p.get("sharedMemPerMultiprocessor", 233472)) // (smem + reserved)
    by_threads = int(p.get("maxThreadsPerMultiProcessor", 2048)) // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, int(p.get("maxBlocksPerMultiProcessor", 32))))


def _kernel_resources(dispatcher: Any) -> tuple[int, int, int] | None:
    """A compiled kernel's registers per thread, shared bytes per block and local bytes per thread."""
    try:
        (ov,) = dispatcher.overloads.values()
        return int(ov.regs_per_thread), int(ov.shared_mem_per_block), int(ov.local_mem_per_thread)
    except Exception:  # noqa: BLE001 - a report, never a failure
        return None


def _launched_kernel(cb: Any, call: Callable[[], Any]) -> Any:
    """The compiled kernel ``call`` launches (one more call, with the backend's lookup watched)."""
    got = []
    typed = cb._typed

    def watched(*a, **k):
        got.append(typed(*a, **k))
        return got[-1]

    cb._typed = watched
    try:
        call()
    finally:
        cb._typed = typed
    return got[-1] if len(got) == 1 else None


def sweep(cp: Any, gaescan: Any, quick: bool, budget: float) -> None:
    """Time a few CUDA tunable settings (each compiles a kernel once) on two shapes.

    Each line names the kernel variant the setting actually got (a tunable that does
    not apply to the shape is dropped by the backend) and its registers, shared and
    local memory (spills) and the blocks per SM they allow.
    """
    from gaescan.backends import cuda as cb

    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    except Exception:  # noqa: BLE001
        props = {}
    seen: dict[tuple, tuple[int, int, int] | None] = {}  # kernel spec -> resources
    rng = np.random.default_rng(3)
    print()
    print("tunable sweep (GAE f32 with dones, CUDA events, median of 10; GB/s at 17 bytes/step);")
    print("[mode K options | registers, shared memory, local memory per thread (spills) -> blocks per SM]:")
    for label, B, T, settings in sweep_shapes(quick):
        r, v, d, a0, r0 = _gae_arrays(cp, rng, (B, T), 0.001)
        ea, _ = ref_gae(r, v, 0.99, 0.95, out_dtype=np.float32, dones=d)
        parts = []
        times = []  # (ms, name) of the settings that ran and were right
        t_first = None
        for i, st in enumerate(settings):
            if _elapsed() > budget:
                parts.append("(budget)")
                break
            name = ",".join(f"{k}={val}" for k, val in st.items())
            try:
                a0.fill(np.nan)
                with cb.override(**st):
                    pl = cb.plan(B, T, np.float32)
                    spec = tuple(pl[k] for k in ("mode", "k", "opts", "threads", "min_blocks_per_sm",
                                                 "layout"))
                    call = functools.partial(gaescan.gae, r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0),
                                             backend="cuda")
                    t = _events_ms(cp, call)
                    if spec not in seen:
                        seen[spec] = _kernel_resources(_launched_kernel(cb, call))
                res = seen[spec]
                kern_txt = f"{pl['mode']} K={pl['k']} {pl['options']}"
                if res is not None:
                    kern_txt += (f" | {res[0]} regs, {res[1]} B smem, {res[2]} B local -> "
                                 f"{blocks_per_sm(res[0], res[1], pl['threads'], props)} blocks/SM")
                # A fast wrong answer is not a result: every timed setting is checked.
                err = compare(a0, ea, np.float32)
                parts.append(f"{name}: {t:.3f} ms {17 * B * T / t / 1e6:.0f} GB/s  ({err})  [{kern_txt}]")
                times.append((t, name))
                if i == 0:
                    t_first = t
            except Exception as exc:  # noqa: BLE001
                parts.append(f"{name}: FAILED {type(exc).__name__}: {exc}")
                RESULTS.append(("FAIL", f"sweep {label} {name}", f"{type(exc).__name__}: {exc}"))
        print(f"  {label}")
        for ptxt in parts:
            print(f"    {ptxt}")
        if t_first is not None:
            best = min(times)
            print(f"    fastest: {best[1]}: {t_first / best[0]:.2f}x the first setting")
        r = v = d = a0 = r0 = None
        cp.get_default_memory_pool().free_all_blocks()


def host_profile(cp: Any, gaescan: Any, calls: int = 300, top: int = 18) -> None:
    """Where the host time of a small call goes: cProfile of back-to-back calls (no sync)."""
    import cProfile
    import io
    import pstats

    r, v, d, a0, r0 = _gae_arrays(cp, np.random.default_rng(5), (8, 1024), 0.01)

    def f():
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, out=(a0, r0), backend="cuda")

    from gaescan.backends import cuda as cb

    for tun in (dict(), dict(direct_launch=True), dict(raw_launch=True)):
        with cb.override(**tun):
            for _ in range(20):
                f()
            cp.cuda.get_current_stream().synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                f()
            prof.disable()
            cp.cuda.get_current_stream().synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        print()
        print(f"host profile ({tun or 'default launch'}): {calls} calls of gae(B=8, T=1024, dones, out=...) "
              "on the cuda backend (cProfile adds its own overhead; compare the rows, not the total)")
        print(buf.getvalue().rstrip())


# --------------------------------------------------------------------------- main


def _header(cp: Any, torch: Any) -> None:
    import numba

    try:
        import numba_cuda

        nc = getattr(numba_cuda, "__version__", "?")
    except Exception:  # noqa: BLE001
        nc = "absent"
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    drv = cp.cuda.runtime.driverGetVersion()
    rt = cp.cuda.runtime.runtimeGetVersion()
    print(f"gaescan GPU check  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"GPU: {name} (cc {props['major']}.{props['minor']}, {props['multiProcessorCount']} SMs, "
          f"{props['totalGlobalMem'] / 2**30:.0f} GiB)")
    print(f"driver CUDA {drv // 1000}.{drv % 1000 // 10}, runtime {rt // 1000}.{rt % 1000 // 10}; "
          f"cupy {cp.__version__}, numba {numba.__version__}, numba-cuda {nc}, "
          f"torch {getattr(torch, '__version__', 'absent')}; python {sys.version.split()[0]}")


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gaescan.bench.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--budget", type=float, default=280.0,
                    help="seconds after which pending benchmarks and sweep settings are skipped (default 280)")
    ap.add_argument("--check-budget", type=float, default=170.0,
                    help="seconds after which pending correctness checks are skipped (default 170)")
    a = ap.parse_args(argv)
    CHECK_BUDGET[0] = a.check_budget
    try:
        import cupy as cp

        if not cp.cuda.is_available():
            print("FAIL  no CUDA GPU visible to CuPy")
            return 2
    except Exception as exc:  # noqa: BLE001
        print(f"FAIL  cannot import CuPy: {exc}")
        return 2
    try:
        import torch
    except Exception:  # noqa: BLE001
        torch = None
    import gaescan

    try:
        _header(cp, torch)
    except Exception as exc:  # noqa: BLE001
        print(f"(header failed: {exc})")

    def warm():
        t = time.perf_counter()
        _oracles()
        x = cp.ones((2, 64), cp.float32)
        gaescan.gae(x, x, gamma=0.9, lam=0.9, dones=x > 0, backend="cuda")
        cp.cuda.get_current_stream().synchronize()
        return f"first call (compiles one kernel) {time.perf_counter() - t:.1f}s"
    check("import + first call", warm)
    try:
        from gaescan.backends import cuda as cb

        print(f"cuda backend tunables: {cb.TUNABLES}")
    except Exception as exc:  # noqa: BLE001
        print(f"(cannot import gaescan.backends.cuda: {exc})")
    if not a.no_check:
        try:
            correctness(cp, gaescan, torch, a.quick)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            RESULTS.append(("FAIL", "correctness driver", str(exc)))
        print(f"-- correctness done at {_elapsed():.0f}s", flush=True)
    if not a.no_bench:
        try:
            benchmarks(cp, gaescan, a.quick, a.budget)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            RESULTS.append(("FAIL", "benchmark driver", str(exc)))
        try:
            host_profile(cp, gaescan)
        except Exception as exc:  # noqa: BLE001
            print(f"(host profile failed: {type(exc).__name__}: {exc})")
    fails = [r for r in RESULTS if r[0] == "FAIL"]
    skips = [r for r in RESULTS if r[0] == "SKIP"]
    print()
    print(f"{len(RESULTS) - len(fails) - len(skips)} passed, {len(fails)} failed, {len(skips)} skipped, "
          f"{_elapsed():.0f}s total")
    for _, name, detail in fails:
        print(f"  FAILED {name}: {detail}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
