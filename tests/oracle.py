"""Reference implementation of SPEC.md, written independently of gaescan.

Everything here is a plain per-row Python loop over float64 scalars, taken
straight from the recurrences in SPEC.md.  It is slow on purpose: it must be
obviously right, not fast.  Nothing in this module imports gaescan.

Conventions (SPEC "Accuracy"): ``gamma``, ``lam``, scalar ``a`` and scalar
``last_value``/``initial`` are first rounded to the *output* dtype (float32
unless a float input array is float64); the recurrence is then evaluated in
float64 on the (exactly converted) inputs.

All ``*_ref`` functions return float64 NumPy arrays shaped like the input;
compare them with the library's result after casting that to float64.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["result_dtype", "gae_ref", "returns_ref", "scan_ref"]


def _is_array(x) -> bool:
    """An "array" input in the sense of the dtype rule (not a Python/NumPy scalar)."""
    if x is None or isinstance(x, (bool, int, float, np.generic)):
        return False
    return hasattr(x, "dtype") and hasattr(x, "shape")


def _dtype_of(x) -> np.dtype:
    dt = x.dtype
    if not isinstance(dt, np.dtype):  # a torch dtype
        dt = np.dtype(str(dt).replace("torch.", ""))
    return dt


def result_dtype(*data) -> np.dtype:
    """float64 if any float *array* among ``data`` is float64, else float32.

    Pass only the inputs that take part in the dtype rule (data and
    coefficients, never flags or cu_seqlens).  Scalars are weak.
    """
    for x in data:
        if _is_array(x) and _dtype_of(x) == np.float64:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def _f64(x) -> np.ndarray:
    """Exact conversion of an array to float64 NumPy (torch tensors included)."""
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().numpy()
    return np.asarray(x).astype(np.float64)


def _flag(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x) != 0


def _coef(x, shape, out_dtype) -> np.ndarray:
    """gamma/lam/a: rounded to the output dtype, then broadcast to ``shape`` (float64)."""
    if _is_array(x):
        arr = _f64(x)
        if out_dtype == np.float32:
            arr = arr.astype(np.float32).astype(np.float64)
    else:
        arr = np.float64(out_dtype.type(x))
    return np.broadcast_to(arr, shape)


def _batch_value(x, batch_shape, out_dtype, default=0.0) -> np.ndarray:
    """last_value/initial: scalar (rounded like gamma) or exactly batch-shaped."""
    if x is None:
        x = default
    if _is_array(x):
        arr = _f64(x)
        assert arr.shape == tuple(batch_shape), (arr.shape, batch_shape)
        return arr
    return np.full(batch_shape, np.float64(out_dtype.type(x)))


def _rows(arr, axis):
    """View ``arr`` as (rows, T) with the time axis last."""
    moved = np.moveaxis(arr, axis, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])


def _unrows(rows, shape, axis):
    moved_shape = list(np.moveaxis(np.empty(shape, dtype=np.int8), axis, -1).shape)
    return np.moveaxis(rows.reshape(moved_shape), -1, axis)


# --------------------------------------------------------------------------- gae


def _gae_row(r, v, nv, term, done, g, lam, m, last, last_adv=0.0):
    """One row of SPEC's gae on positions [0, T); returns (adv, ret) lists."""
    T = len(r)
    adv = [0.0] * T
    ret = [0.0] * T
    a_next = last_adv  # A at the next valid position (A_T = last_advantage, default 0)
    v_next = last  # V at the next valid position, or last_value
    for t in range(T - 1, -1, -1):
        if not m[t]:
            continue  # never read anything at a masked position
        vprime = nv[t] if nv is not None else v_next
        boot = 0.0 if term[t] else g[t] * vprime  # a select: V' is not read
        delta = r[t] + boot - v[t]
        carry = 0.0 if done[t] else g[t] * lam[t] * a_next  # a select
        a_t = delta + carry
        adv[t] = a_t
        ret[t] = a_t + v[t]
        a_next = a_t
        v_next = v[t]
    return adv, ret


def gae_ref(
    rewards,
    values,
    *,
    gamma,
    lam,
    next_values=None,
    last_value=None,
    last_advantage=None,
    dones=None,
    terminated=None,
    truncated=None,
    mask=None,
    cu_seqlens=None,
    axis=-1,
    out_dtype=None,
):
    """Float64 (advantages, returns) per SPEC ``gae`` (plus ``last_advantage`` = A_T)."""
    if out_dtype is None:
        out_dtype = result_dtype(rewards, values, next_values, last_value, last_advantage, gamma, lam)
    out_dtype = np.dtype(out_dtype)
    r = _f64(rewards)
    shape = r.shape
    v = _f64(values)
    nv = None if next_values is None else _f64(next_values)
    false = np.zeros(shape, dtype=bool)
    if dones is not None:
        term = _flag(dones)
        done = term
    else:
        term = false if terminated is None else _flag(terminated)
        trunc = false if truncated is None else _flag(truncated)
        done = term | trunc
    m = np.ones(shape, dtype=bool) if mask is None else _flag(mask)
    g = _coef(gamma, shape, out_dtype)
    lm = _coef(lam, shape, out_dtype)

    rr, vr, tr, dr, gr, lr, mr = (_rows(x, axis) for x in (r, v, term, done, g, lm, m))
    nvr = None if nv is None else _rows(nv, axis)
    adv = np.zeros(rr.shape)
    ret = np.zeros(rr.shape)
    if cu_seqlens is None:
        batch_shape = np.moveaxis(np.empty(shape, dtype=np.int8), axis, -1).shape[:-1]
        last = _batch_value(last_value, batch_shape, out_dtype).reshape(-1)
        last_adv = _batch_value(last_advantage, batch_shape, out_dtype).reshape(-1)
        segs = [(i, 0, rr.shape[1], i) for i in range(rr.shape[0])]
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens)]
        last = _batch_value(last_value, (len(cu) - 1,), out_dtype)
        last_adv = _batch_value(last_advantage, (len(cu) - 1,), out_dtype)
        segs = [(0, cu[s], cu[s + 1], s) for s in range(len(cu) - 1)]
    for row, lo, hi, k in segs:
        sl = slice(lo, hi)
        a, b = _gae_row(
            list(rr[row, sl]),
            list(vr[row, sl]),
            None if nvr is None else list(nvr[row, sl]),
            list(tr[row, sl]),
            list(dr[row, sl]),
            list(gr[row, sl]),
            list(lr[row, sl]),
            list(mr[row, sl]),
            float(last[k]),
            float(last_adv[k]),
        )
        adv[row, sl] = a
        ret[row, sl] = b
    return _unrows(adv, shape, axis), _unrows(ret, shape, axis)


# ----------------------------------------------------------------------- returns


def _returns_row(r, done, g, m, last):
    T = len(r)
    out = [0.0] * T
    g_next = last  # G at the next valid position, or last_value
    for t in range(T - 1, -1, -1):
        if not m[t]:
            continue
        carry = 0.0 if done[t] else g[t] * g_next  # a select
        out[t] = r[t] + carry
        g_next = out[t]
    return out


def returns_ref(
    rewards,
    *,
    gamma,
    dones=None,
    last_value=None,
    mask=None,
    cu_seqlens=None,
    axis=-1,
    out_dtype=None,
):
    """Float64 discounted returns per SPEC ``discounted_returns``."""
    if out_dtype is None:
        out_dtype = result_dtype(rewards, gamma, last_value)
    out_dtype = np.dtype(out_dtype)
    r = _f64(rewards)
    shape = r.shape
    done = np.zeros(shape, dtype=bool) if dones is None else _flag(dones)
    m = np.ones(shape, dtype=bool) if mask is None else _flag(mask)
    g = _coef(gamma, shape, out_dtype)
    rr, dr, gr, mr = (_rows(x, axis) for x in (r, done, g, m))
    res = np.zeros(rr.shape)
    if cu_seqlens is None:
        batch_shape = np.moveaxis(np.empty(shape, dtype=np.int8), axis, -1).shape[:-1]
        last = _batch_value(last_value, batch_shape, out_dtype).reshape(-1)
        segs = [(i, 0, rr.shape[1], i) for i in range(rr.shape[0])]
    else:
        cu = [int(c) for c in np.asarray(cu_seqlens)]
        last = _batch_value(last_value, (len(cu) - 1,), out_dtype)
        segs = [(0, cu[s], cu[s + 1], s) for s in range(len(cu) - 1)]
    for row, lo, hi, k in segs:
        sl = slice(lo, hi)
        res[row, sl] = _returns_row(
            list(rr[row, sl]), list(dr[row, sl]), list(gr[row, sl]), list(mr[row, sl]), float(last[k])
        )
    return _unrows(res, shape, axis)


# -------------------------------------------------------------------- linear scan


def scan_ref(a, b, *, reverse=False, initial=None, axis=-1, out_dtype=None):
    """Float64 y per SPEC ``linear_scan`` (forward or reverse)."""
    if out_dtype is None:
        out_dtype = result_dtype(a, b, initial)
    out_dtype = np.dtype(out_dtype)
    bb = _f64(b)
    shape = bb.shape
    aa = _coef(a, shape, out_dtype)
    br, ar = _rows(bb, axis), _rows(aa, axis)
    batch_shape = np.moveaxis(np.empty(shape, dtype=np.int8), axis, -1).shape[:-1]
    init = _batch_value(initial, batch_shape, out_dtype).reshape(-1)
    res = np.zeros(br.shape)
    T = br.shape[1]
    order = range(T - 1, -1, -1) if reverse else range(T)
    for i in range(br.shape[0]):
        y = float(init[i])
        arow, brow = list(ar[i]), list(br[i])
        for t in order:
            y = arow[t] * y + brow[t]
            res[i, t] = y
    return _unrows(res, shape, axis)


# ------------------------------------------------------------------------ metric


def rel_l2(actual, expected) -> float:
    """||actual - expected|| / max(||expected||, tiny), in float64.

    Non-finite entries must match exactly (same positions, same values); they
    are then excluded from the norm.  A mismatch there returns ``inf``.
    """
    x = _f64(actual)
    y = _f64(expected)
    assert x.shape == y.shape, (x.shape, y.shape)
    fin_y = np.isfinite(y)
    fin_x = np.isfinite(x)
    if not np.array_equal(fin_x, fin_y):
        return math.inf
    bad = ~fin_y
    if bad.any() and not np.array_equal(x[bad], y[bad], equal_nan=True):
        return math.inf
    num = np.linalg.norm((x - y)[fin_y])
    den = max(np.linalg.norm(y[fin_y]), np.finfo(np.float64).tiny)
    return float(num / den)
