"""Slow float64 references of gaescan's public functions, and ``assert_close``.

Every public function has a reference here with the same name and the same
signature (``gaescan.testing.gae`` for :func:`gaescan.gae`, and so on), in the
manner of bottleneck's ``bn.slow``; a new public function gets its reference
here in the same form.  Each one is the contract (docs/semantics.md) read
literally: a plain loop over time in float64, written without any of
gaescan's kernels, validation or dispatch, so that it can check them.  Users
can check their own pipelines against it the same way the test suite,
``gaescan bench`` and the GPU check do::

    >>> import numpy as np, gaescan, gaescan.testing
    >>> rng = np.random.default_rng(0)
    >>> r, v = rng.standard_normal((2, 4, 50)).astype(np.float32)
    >>> kw = dict(gamma=0.99, lam=0.95, dones=rng.random((4, 50)) < 0.1)
    >>> got = gaescan.gae(r, v, **kw)
    >>> want = gaescan.testing.gae(r, v, **kw)
    >>> gaescan.testing.assert_close(got.advantages, want.advantages) < 2e-5
    True

Conventions shared by the references (the contract, docs/semantics.md: "Accuracy" and "Types, dtypes,
shapes"):

* The output dtype follows the library's rule: float64 if any float input
  array is float64 (or wider), else float32; scalars are weak.  ``gamma``,
  ``lam``, ``a``, and ``last_value``/``last_advantage``/``initial`` are first
  rounded to that dtype; the recurrence then runs in float64 on the exactly
  converted inputs.
* The results are **float64 NumPy arrays** shaped like the inputs, whatever
  the array library of the inputs (NumPy, CuPy, PyTorch, Dask and anything
  else with ``__array__`` are copied to the host).  Compare them with
  :func:`assert_close`, whose tolerance is the output dtype's.
* Dones and terminations are selects, as is ``a == 0`` in
  :func:`linear_scan` (``y_t = b_t``) and a zero decay in the other scans
  (γλ in :func:`gae` and :func:`turn_gae`, γ in :func:`discounted_returns`,
  γ·c in :func:`vtrace`: the carry is dropped): a NaN or inf never crosses them.
  Masked positions are skipped, never read, and exactly 0 in the output.
* The arguments are assumed valid; the references do not repeat the
  library's argument checks.  ``out`` and ``backend`` are accepted so that one
  set of keyword arguments can be passed to both, and are ignored.

The loops are vectorised across rows (NumPy operations on all rows at one
time step), and run one row or segment at a time in plain Python where there
are few rows or packed segments.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "GAEResult",
    "gae",
    "discounted_returns",
    "linear_scan",
    "Moments",
    "group_normalize",
    "moments",
    "combine_moments",
    "whiten",
    "assert_close",
    "tolerance",
    "result_dtype",
]


class GAEResult(NamedTuple):
    """The reference ``(advantages, returns)``, float64 NumPy arrays."""

    advantages: np.ndarray
    returns: np.ndarray


# Below this many rows a scan runs row by row in plain Python, which is
# faster there than one NumPy call per time step.
_MIN_VECTOR_ROWS = 16
# Whether the row loops take NumPy arrays (compiled by _compile_row_loops) or lists.
_ARRAYS = [False]


# --------------------------------------------------------------------------- inputs


def _host(x: Any) -> Any:
    """``x`` as a NumPy array (a copy from the device where needed), or unchanged if scalar."""
    if x is None or _is_scalar(x):
        return x
    if type(x) is np.ndarray:
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch, without importing it
        return x.detach().cpu().numpy()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # CuPy
        return x.get()
    return np.asarray(x)


def _is_scalar(x: Any) -> bool:
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return True
    return isinstance(x, np.ndarray) and x.ndim == 0


def result_dtype(*inputs: Any) -> np.dtype:
    """The dtype of a result computed from ``inputs``: the contract's rule.

    Parameters
    ----------
    *inputs
        The data and coefficient arguments of a call (arrays of any library,
        scalars or ``None``); flags and ``cu_seqlens`` take no part.

    Returns
    -------
    numpy.dtype
        float64 if any float input *array* is 64-bit or wider, else float32:
        scalars are weak, float16, integer and bool arrays give float32.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> gaescan.testing.result_dtype(np.zeros(2, np.float32), 0.5, np.float64(0.5))
    dtype('float32')
    >>> gaescan.testing.result_dtype(np.zeros(2, np.float32), np.zeros(2))
    dtype('float64')
    """
    for x in inputs:
        if x is None or _is_scalar(x):
            continue
        dt = getattr(x, "dtype", None)
        if dt is None:
            continue
        if not isinstance(dt, np.dtype):  # a torch dtype
            dt = np.dtype(str(dt).replace("torch.", ""))
        if dt.kind == "f" and dt.itemsize >= 8:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def _rounded(x: Any, dtype: np.dtype) -> Any:
    """A coefficient or boundary value rounded to ``dtype``, as float64."""
    if _is_scalar(x):
        return np.float64(dtype.type(x))
    return np.asarray(x).astype(dtype).astype(np.float64)


class _Rows:
    """The time axis first: every input as a ``(T, R)`` float64 or bool array."""

    def __init__(self, shape: tuple, axis: int):
        self.shape = shape
        self.axis = axis % len(shape)
        self.T = shape[self.axis]
        self.batch = shape[: self.axis] + shape[self.axis + 1:]
        self.R = math.prod(self.batch)

    def take(self, x: Any, kind: Any = np.float64) -> np.ndarray:
        x = np.broadcast_to(np.asarray(x), self.shape)
        return np.ascontiguousarray(np.moveaxis(x, self.axis, 0).reshape(self.T, self.R), dtype=kind)

    def flag(self, x: Any, default: bool) -> np.ndarray:
        if x is None:
            return np.full((self.T, self.R), default)
        return self.take(np.asarray(x) != 0, np.bool_)

    def boundary(self, x: Any, dtype: np.dtype) -> np.ndarray:
        """A scalar or batch-shaped boundary value, one float64 per row."""
        x = 0.0 if x is None else x
        return np.broadcast_to(_rounded(x, dtype), self.batch).reshape(self.R).astype(np.float64)

    def back(self, y: np.ndarray) -> np.ndarray:
        return np.moveaxis(y.reshape((self.T,) + self.batch), 0, self.axis)


def _per_segment(x: Any, n: int, dtype: np.dtype) -> np.ndarray:
    """A scalar or ``(S,)`` boundary value of packed segments, as float64."""
    x = 0.0 if x is None else x
    return np.broadcast_to(_rounded(x, dtype), (n,)).astype(np.float64)


def _segments(cu_seqlens: Any) -> tuple[np.ndarray, np.ndarray]:
    cu = np.asarray(_host(cu_seqlens)).astype(np.int64)
    return cu[:-1], cu[1:]


def _lists(*xs: np.ndarray) -> list:
    """Python lists: a plain Python loop indexes them faster than NumPy arrays."""
    if _ARRAYS[0]:
        return [np.ascontiguousarray(x) for x in xs]
    return [x.tolist() for x in xs]


def _zeros(n: int) -> Any:
    return np.zeros(n) if _ARRAYS[0] else [0.0] * n


def _compile_row_loops(jit: Any) -> None:
    """Run every scan through its row loop compiled by ``jit`` (e.g. ``numba.njit``).

    The same loops, compiled: for a caller that checks many rows of millions
    of steps (the GPU check) and has a compiler at hand.  This module does not
    import one itself.
    """
    global _gae_row, _returns_row, _scan_row, _MIN_VECTOR_ROWS
    if _ARRAYS[0]:
        return
    _gae_row, _returns_row, _scan_row = jit(_gae_row), jit(_returns_row), jit(_scan_row)
    _MIN_VECTOR_ROWS = 2**62
    _ARRAYS[0] = True


# ----------------------------------------------------------------------------- gae


def _gae_row(r, v, nv, term, done, g, gl, m, lo, hi, a_next, v_next, adv, ret):
    """The contract's ``gae`` backwards over positions ``[lo, hi)`` of 1-D sequences."""
    for t in range(hi - 1, lo - 1, -1):
        if not m[t]:
            continue  # skipped: nothing at t is read, its outputs stay 0
        vp = v_next if nv is None else nv[t]
        delta = r[t] - v[t] if term[t] else r[t] + g[t] * vp - v[t]
        a = delta if done[t] or gl[t] == 0 else delta + gl[t] * a_next
        adv[t] = a
        ret[t] = a + v[t]
        a_next = a
        v_next = v[t]


@np.errstate(all="ignore")  # 0·inf at a select: computed, then not chosen
def _gae_rows(r, v, nv, term, done, g, gl, m, a_next, v_next):
    """The contract's ``gae`` on ``(T, R)`` arrays, backwards in time, all rows per step."""
    adv = np.zeros(r.shape)
    ret = np.zeros(r.shape)
    for t in range(r.shape[0] - 1, -1, -1):
        vp = v_next if nv is None else nv[t]
        delta = np.where(term[t], r[t] - v[t], r[t] + g[t] * vp - v[t])
        a = np.where(done[t] | (gl[t] == 0), delta, delta + gl[t] * a_next)
        keep = m[t]
        adv[t] = np.where(keep, a, 0.0)
        ret[t] = np.where(keep, a + v[t], 0.0)
        a_next = np.where(keep, a, a_next)
        v_next = np.where(keep, v[t], v_next)
    return adv, ret


def gae(rewards: Any, values: Any, *, gamma: Any, lam: Any, next_values: Any = None,
        last_value: Any = None, last_advantage: Any = None, dones: Any = None,
        terminated: Any = None, truncated: Any = None, mask: Any = None,
        cu_seqlens: Any = None, axis: int = -1, out: Any = None, backend: Any = "auto") -> GAEResult:
    r"""The float64 reference of :func:`gaescan.gae`.

    Per row, backwards in time: ``δ_t = r_t + γ_t (1 − term_t) V'_t − V_t``,
    ``A_t = δ_t + γ_t λ_t (1 − done_t) A_{t+1}`` with ``A_T = last_advantage``,
    ``R_t = A_t + V_t``, where ``V'_t`` is ``next_values[t]``, else the value
    at the next valid position, else ``last_value``.

    Parameters
    ----------
    rewards, values, gamma, lam, next_values, last_value, last_advantage, dones, terminated, truncated, mask, cu_seqlens, axis
        As for :func:`gaescan.gae`, in any array library.
    out, backend
        Ignored (accepted so that a call's keyword arguments can be reused).

    Returns
    -------
    GAEResult
        ``(advantages, returns)`` as float64 NumPy arrays of the input shape.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> r = np.array([1.0, 0.0, 1.0]); v = np.array([0.5, 0.5, 0.5])
    >>> gaescan.testing.gae(r, v, gamma=1.0, lam=1.0, dones=np.array([0, 1, 0])).advantages
    array([ 0.5, -0.5,  0.5])
    """
    dtype = result_dtype(rewards, values, next_values, last_value, last_advantage, gamma, lam)
    rewards, values, next_values, last_value, last_advantage, gamma, lam = map(
        _host, (rewards, values, next_values, last_value, last_advantage, gamma, lam))
    dones, terminated, truncated, mask = map(_host, (dones, terminated, truncated, mask))
    shape = np.shape(rewards)
    if dones is not None:
        terminated, truncated = dones, None
    if cu_seqlens is not None or len(shape) == 0:
        axis = -1
    if len(shape) == 0:
        shape = (1,)
    rows = _Rows(shape, axis)
    g = rows.take(_rounded(gamma, dtype))
    gl = g * rows.take(_rounded(lam, dtype))  # γ·λ of the rounded coefficients, in float64
    r, v = rows.take(rewards), rows.take(values)
    nv = None if next_values is None else rows.take(next_values)
    term = rows.flag(terminated, False)
    done = term | rows.flag(truncated, False)
    m = rows.flag(mask, True)
    if cu_seqlens is None and rows.R >= _MIN_VECTOR_ROWS:
        adv, ret = _gae_rows(r, v, nv, term, done, g, gl, m,
                             rows.boundary(last_advantage, dtype), rows.boundary(last_value, dtype))
        return GAEResult(rows.back(adv), rows.back(ret))
    if cu_seqlens is not None:
        lo, hi = _segments(cu_seqlens)
        lv, la = _per_segment(last_value, len(lo), dtype), _per_segment(last_advantage, len(lo), dtype)
        cols = [(0, lo, hi, lv, la)]
    else:
        lv, la = rows.boundary(last_value, dtype), rows.boundary(last_advantage, dtype)
        cols = [(j, [0], [rows.T], lv[j:j + 1], la[j:j + 1]) for j in range(rows.R)]
    adv = np.zeros(r.shape)
    ret = np.zeros(r.shape)
    for j, los, his, lvs, las in cols:
        col = [x[:, j] for x in (r, v, term, done, g, gl, m)]
        cr, cv, ct, cd, cg, cgl, cm = _lists(*col)
        cnv = None if nv is None else _lists(nv[:, j])[0]
        a_out, r_out = _zeros(rows.T), _zeros(rows.T)
        for s in range(len(los)):
            _gae_row(cr, cv, cnv, ct, cd, cg, cgl, cm, int(los[s]), int(his[s]), float(las[s]), float(lvs[s]),
                     a_out, r_out)
        adv[:, j], ret[:, j] = a_out, r_out
    return GAEResult(rows.back(adv), rows.back(ret))


# ------------------------------------------------------------------ discounted returns


def _returns_row(r, done, g, m, lo, hi, g_next, out):
    """The contract's ``discounted_returns`` backwards over positions ``[lo, hi)``."""
    for t in range(hi - 1, lo - 1, -1):
        if not m[t]:
            continue
        y = r[t] if done[t] or g[t] == 0 else r[t] + g[t] * g_next
        out[t] = y
        g_next = y


@np.errstate(all="ignore")  # 0·inf at a select: computed, then not chosen
def _returns_rows(r, done, g, m, g_next):
    out = np.zeros(r.shape)
    for t in range(r.shape[0] - 1, -1, -1):
        y = np.where(done[t] | (g[t] == 0), r[t], r[t] + g[t] * g_next)
        out[t] = np.where(m[t], y, 0.0)
        g_next = np.where(m[t], y, g_next)
    return out


def discounted_returns(rewards: Any, *, gamma: Any, dones: Any = None, last_value: Any = None,
                       mask: Any = None, cu_seqlens: Any = None, axis: int = -1, out: Any = None,
                       backend: Any = "auto") -> np.ndarray:
    r"""The float64 reference of :func:`gaescan.discounted_returns`.

    ``G_t = r_t + γ_t (1 − done_t) G_{t+1}`` with ``G_T = last_value``; a done
    is a select, masked positions are skipped and 0.

    Parameters
    ----------
    rewards, gamma, dones, last_value, mask, cu_seqlens, axis
        As for :func:`gaescan.discounted_returns`, in any array library.
    out, backend
        Ignored.

    Returns
    -------
    numpy.ndarray
        ``G`` in float64, of the input shape.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> gaescan.testing.discounted_returns(np.array([1.0, 1.0, 1.0]), gamma=0.5)
    array([1.75, 1.5 , 1.  ])
    """
    dtype = result_dtype(rewards, gamma, last_value)
    rewards, gamma, last_value, dones, mask = map(_host, (rewards, gamma, last_value, dones, mask))
    shape = np.shape(rewards)
    if cu_seqlens is not None or len(shape) == 0:
        axis = -1
    if len(shape) == 0:
        shape = (1,)
    rows = _Rows(shape, axis)
    r, g = rows.take(rewards), rows.take(_rounded(gamma, dtype))
    done, m = rows.flag(dones, False), rows.flag(mask, True)
    if cu_seqlens is None and rows.R >= _MIN_VECTOR_ROWS:
        return rows.back(_returns_rows(r, done, g, m, rows.boundary(last_value, dtype)))
    if cu_seqlens is not None:
        lo, hi = _segments(cu_seqlens)
        cols = [(0, lo, hi, _per_segment(last_value, len(lo), dtype))]
    else:
        lv = rows.boundary(last_value, dtype)
        cols = [(j, [0], [rows.T], lv[j:j + 1]) for j in range(rows.R)]
    res = np.zeros(r.shape)
    for j, los, his, lvs in cols:
        cr, cd, cg, cm = _lists(r[:, j], done[:, j], g[:, j], m[:, j])
        y = _zeros(rows.T)
        for s in range(len(los)):
            _returns_row(cr, cd, cg, cm, int(los[s]), int(his[s]), float(lvs[s]), y)
        res[:, j] = y
    return rows.back(res)


# ------------------------------------------------------------------------- linear scan


def _scan_row(a, b, reverse, y, out):
    """The contract's ``linear_scan`` over one 1-D sequence; ``a == 0`` selects ``b``."""
    n = len(b)
    for i in range(n):
        t = n - 1 - i if reverse else i
        y = b[t] if a[t] == 0 else a[t] * y + b[t]
        out[t] = y


@np.errstate(all="ignore")  # 0·inf at a select: computed, then not chosen
def _scan_rows(a, b, reverse, y):
    out = np.zeros(b.shape)
    T = b.shape[0]
    for i in range(T):
        t = T - 1 - i if reverse else i
        y = np.where(a[t] == 0, b[t], a[t] * y + b[t])
        out[t] = y
    return out


def linear_scan(a: Any, b: Any, *, reverse: bool = False, initial: Any = None, axis: int = -1,
                out: Any = None, backend: Any = "auto") -> np.ndarray:
    r"""The float64 reference of :func:`gaescan.linear_scan`.

    Forward ``y_t = a_t y_{t−1} + b_t`` from ``y_{−1} = initial``, or reverse
    ``y_t = a_t y_{t+1} + b_t`` from ``y_T = initial``.  A zero ``a_t`` is a
    select, ``y_t = b_t``, so a NaN or inf before it does not cross it.

    Parameters
    ----------
    a, b, reverse, initial, axis
        As for :func:`gaescan.linear_scan`, in any array library.
    out, backend
        Ignored.

    Returns
    -------
    numpy.ndarray
        ``y`` in float64, of ``b``'s shape.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> gaescan.testing.linear_scan(np.array([0.5, 0.0, 0.5]), np.array([1.0, np.nan, 1.0]))
    array([ 1., nan, nan])
    >>> gaescan.testing.linear_scan(np.array([0.5, 0.0, 0.5]), np.array([np.nan, 1.0, 1.0]))
    array([nan, 1. , 1.5])
    """
    dtype = result_dtype(a, b, initial)
    a, b, initial = map(_host, (a, b, initial))
    shape = np.shape(b)
    if len(shape) == 0:
        shape, axis = (1,), -1
    rows = _Rows(shape, axis)
    aa, bb = rows.take(_rounded(a, dtype)), rows.take(b)
    init = rows.boundary(initial, dtype)
    if rows.R >= _MIN_VECTOR_ROWS:
        return rows.back(_scan_rows(aa, bb, bool(reverse), init))
    res = np.zeros(bb.shape)
    for j in range(rows.R):
        y = _zeros(rows.T)
        ca, cb = _lists(aa[:, j], bb[:, j])
        _scan_row(ca, cb, bool(reverse), float(init[j]), y)
        res[:, j] = y
    return rows.back(res)


# --------------------------------------------------------------------------- statistics


class Moments(NamedTuple):
    """The reference ``(count, mean, m2)``, float64 0-d NumPy arrays."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray


def _flat_valid(x: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as flat float64 and the flat boolean mask (all true when absent)."""
    xs = np.asarray(_host(x))
    flat = xs.reshape(-1).astype(np.float64)
    if mask is None:
        return flat, np.ones(flat.shape, dtype=bool)
    return flat, np.asarray(_host(mask)).reshape(-1) != 0


def group_normalize(scores: Any, *, groups: Any = None, group_size: Any = None, leave_one_out: bool = False,
                    scale: bool = True, ddof: int = 1, eps: float = 1e-6, out: Any = None,
                    backend: str = "auto") -> np.ndarray:
    """Reference :func:`gaescan.group_normalize`: a plain loop over the groups, in float64.

    Each group's members are collected in index order; its mean and its
    centred sum of squares are two plain passes over them, and every
    member's advantage is the contract's formula read literally (the
    leave-one-out baseline as ``(sum − s_i) / (n − 1)``).

    Returns
    -------
    numpy.ndarray
        The advantages, float64, shape ``(B,)``.

    Examples
    --------
    >>> import numpy as np, gaescan, gaescan.testing
    >>> s = np.array([3.0, 1.0, 2.0, 2.0])
    >>> gaescan.testing.group_normalize(s, groups=[5, 9, 5, 9], scale=False)
    array([ 0.5, -0.5, -0.5,  0.5])
    """
    s = np.asarray(_host(scores)).astype(np.float64).tolist()
    B = len(s)
    if groups is None:
        labels = [i // group_size for i in range(B)]
    else:
        labels = np.asarray(_host(groups)).tolist()
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(labels):
        members.setdefault(g, []).append(i)
    adv = np.zeros(B)
    for idx in members.values():
        n = len(idx)
        if n == 1 or (scale and n <= ddof):
            for i in idx:
                adv[i] = s[i]
            continue
        total = 0.0
        for i in idx:
            total += s[i]
        mean = total / n
        sigma = 0.0
        if scale:
            m2 = 0.0
            for i in idx:
                m2 += (s[i] - mean) ** 2
            sigma = math.sqrt(m2 / (n - ddof))
        for i in idx:
            b = (total - s[i]) / (n - 1) if leave_one_out else mean
            with np.errstate(all="ignore"):
                adv[i] = (np.float64(s[i]) - b) / (np.float64(sigma) + eps) if scale else s[i] - b
    return adv


def moments(x: Any, mask: Any = None, *, backend: str = "auto") -> Moments:
    """Reference :func:`gaescan.moments`: two float64 passes over the valid elements.

    Returns
    -------
    Moments
        ``(count, mean, m2)`` as float64 0-d arrays; ``mean = m2 = 0`` when
        there is no valid element.
    """
    flat, valid = _flat_valid(x, mask)
    vals = flat[valid]  # masked elements are never read into any sum
    n = vals.shape[0]
    mean = float(np.sum(vals)) / n if n else 0.0
    with np.errstate(invalid="ignore"):  # inf − inf where an element is infinite: NaN, as intended
        m2 = float(np.sum((vals - mean) ** 2)) if n else 0.0
    return Moments(np.asarray(float(n)), np.asarray(mean), np.asarray(m2))


_moments = moments  # whiten's parameter of the same name hides the function there


def combine_moments(ms: Any) -> Moments:
    """Reference :func:`gaescan.combine_moments`: Chan's update, one part after another.

    ``ms`` is a sequence of moments, or one whose fields are stacked along a
    leading axis (1-D fields).
    """
    if isinstance(ms, tuple) and len(ms) == 3 and not isinstance(ms[0], tuple):
        parts = list(zip(*(np.asarray(_host(f)).astype(np.float64).tolist() for f in ms), strict=True))
    else:
        parts = [tuple(float(np.asarray(_host(f))) for f in m) for m in ms]
    n = mean = m2 = 0.0
    for nb, mb, m2b in parts:
        if nb == 0:
            continue
        if n == 0:
            n, mean, m2 = nb, mb, m2b
            continue
        tot = n + nb
        delta = mb - mean
        mean += delta * nb / tot
        m2 += m2b + delta * delta * n * nb / tot
        n = tot
    return Moments(np.asarray(n), np.asarray(mean), np.asarray(m2))


def whiten(x: Any, mask: Any = None, *, shift_mean: bool = True, ddof: int = 1, eps: float = 1e-8,
           moments: Any = None, out: Any = None, backend: str = "auto") -> np.ndarray:
    """Reference :func:`gaescan.whiten`: the contract's formula over the valid elements, in float64.

    Returns
    -------
    numpy.ndarray
        ``y``, float64, of the shape of ``x``; exactly 0 at masked positions.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> gaescan.testing.whiten(np.array([1.0, 3.0, 7.0]), np.array([1, 1, 0]), eps=0.0)
    array([-0.70710678,  0.70710678,  0.        ])
    """
    xs = np.asarray(_host(x))
    flat, valid = _flat_valid(x, mask)
    if moments is None:
        moments = _moments(x, mask)
    count, mean, m2 = (float(np.asarray(_host(f))) for f in moments)
    y = np.zeros(flat.shape)
    if count > 0:
        var = m2 / (count - ddof) if count > ddof else 0.0
        with np.errstate(all="ignore"):
            y[valid] = (flat[valid] - mean) / np.sqrt(np.float64(var + eps))
            if not shift_mean:
                y[valid] += mean
    return y.reshape(xs.shape)


# --------------------------------------------------------------------------- comparing


def tolerance(dtype: Any) -> float:
    """The contract's bound on the relative L2 error of a result of ``dtype``.

    Parameters
    ----------
    dtype : dtype-like
        The result's dtype: float64 (``1e-12``), anything else (``2e-5``; the
        library returns float32 for every other input dtype).

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> gaescan.testing.tolerance(np.float32), gaescan.testing.tolerance("float64")
    (2e-05, 1e-12)
    """
    return 1e-12 if np.dtype(dtype) == np.float64 else 2e-5


def _host_dtype(x: Any) -> np.dtype:
    dt = x.dtype
    if not isinstance(dt, np.dtype):  # a torch dtype
        dt = np.dtype(str(dt).replace("torch.", ""))
    return dt


def assert_close(actual: Any, desired: Any, *, dtype: Any = None) -> float:
    """Assert that a result is within the contract's tolerance of a reference.

    The relative L2 error ``‖actual − desired‖ / ‖desired‖`` over the finite
    entries must be at most :func:`tolerance` of the result's dtype.  The
    non-finite entries must match exactly: the same positions, the same
    values (NaN matches NaN, ``inf`` only ``inf`` of the same sign).

    Parameters
    ----------
    actual : array
        The result to check: a NumPy or CuPy array or a PyTorch tensor (copied
        to the host; neither library is imported here).
    desired : array
        The reference, usually a float64 result of this module.
    dtype : dtype-like, optional
        The dtype the result must have; it also sets the tolerance.  Default:
        ``actual``'s dtype.

    Returns
    -------
    float
        The relative L2 error, for reports.

    Raises
    ------
    AssertionError
        On a different shape or dtype, mismatched non-finite entries, or an
        error above the tolerance; the message gives the error and the worst
        position.

    Examples
    --------
    >>> import numpy as np, gaescan, gaescan.testing
    >>> b = np.arange(5.0)
    >>> err = gaescan.testing.assert_close(gaescan.linear_scan(0.9, b), gaescan.testing.linear_scan(0.9, b))
    >>> gaescan.testing.assert_close(np.float64([1.0, 2.0]), np.float64([1.0, 2.1]))
    Traceback (most recent call last):
        ...
    AssertionError: relative L2 error 0.043 > 1e-12 for float64 (worst at (1,): 2.0 vs 2.1)
    """
    got_dtype = _host_dtype(actual) if hasattr(actual, "dtype") else np.asarray(actual).dtype
    if dtype is not None and got_dtype != np.dtype(dtype):
        raise AssertionError(f"dtype {got_dtype} != {np.dtype(dtype)}")
    dtype = np.dtype(dtype if dtype is not None else got_dtype)
    x = np.asarray(_host(actual)).astype(np.float64)
    y = np.asarray(_host(desired)).astype(np.float64)
    if x.shape != y.shape:
        raise AssertionError(f"shape {x.shape} != {y.shape}")
    fin = np.isfinite(y)
    if not np.array_equal(np.isfinite(x), fin):
        where = np.argwhere(np.isfinite(x) != fin)
        raise AssertionError(f"{len(where)} non-finite entries differ, first at {tuple(where[0])}: "
                             f"{x[tuple(where[0])]} vs {y[tuple(where[0])]}")
    if not np.array_equal(x[~fin], y[~fin], equal_nan=True):
        raise AssertionError("non-finite entries differ in value (NaN, +inf, -inf)")
    diff = np.zeros(x.shape)
    diff[fin] = x[fin] - y[fin]
    num = float(np.linalg.norm(diff))
    den = max(float(np.linalg.norm(y[fin])), np.finfo(np.float64).tiny)
    err = num / den
    tol = tolerance(dtype)
    if not err <= tol:
        i = tuple(int(k) for k in np.unravel_index(int(np.argmax(np.abs(diff))), diff.shape))
        raise AssertionError(f"relative L2 error {err:.3g} > {tol:g} for {dtype} "
                             f"(worst at {i}: {x[i]} vs {y[i]})")
    return err


# ------------------------------------------------------------------------------ v-trace


class VTraceResult(NamedTuple):
    """The reference ``(vs, advantages)``, float64 NumPy arrays."""

    vs: np.ndarray
    advantages: np.ndarray


def _exp(x: float) -> float:
    """``e**x`` in float64, ``inf`` on overflow (``math.exp`` raises there)."""
    return math.exp(x) if x < 709.0 else (math.inf if x == x else x)


def _clip(bar: float, x: float) -> float:
    """``min(bar, x)`` that keeps a NaN ``x`` (Python's ``min`` may drop it)."""
    return x if x != x or x < bar else bar


def _vtrace_row(r, v, lr, nv, term, done, g, lam, m, lo, hi, rb, cb, pb, v_next, d_next, vs, adv):
    """The contract's ``vtrace`` backwards over positions ``[lo, hi)`` of 1-D sequences
    (``d_next`` is ``D`` past ``hi``, the ``last_trace``)."""
    for t in range(hi - 1, lo - 1, -1):
        if not m[t]:
            continue  # skipped: nothing at t is read, its outputs stay 0
        e = _exp(lr[t])
        # A zero γ or λ is a zero decay whatever e: a select (times an infinite e it is no NaN).
        rho, c, rpg = _clip(rb, e), 0.0 if lam[t] == 0 else lam[t] * _clip(cb, e), _clip(pb, e)
        vp = v_next if nv is None else nv[t]
        td = r[t] - v[t] if term[t] else r[t] + g[t] * vp - v[t]
        decay = 0.0 if g[t] == 0 else g[t] * c
        dt = rho * td if done[t] or decay == 0 else rho * td + decay * d_next
        vsp = vp if done[t] else vp + d_next
        adv[t] = rpg * (r[t] - v[t]) if term[t] else rpg * (r[t] + g[t] * vsp - v[t])
        vs[t] = v[t] + dt
        d_next = dt
        v_next = v[t]


def vtrace(rewards: Any, values: Any, log_rhos: Any, *, gamma: Any, lam: Any = 1.0, rho_bar: Any = 1.0,
           c_bar: Any = 1.0, pg_rho_bar: Any = None, next_values: Any = None, last_value: Any = None,
           last_trace: Any = None, dones: Any = None, terminated: Any = None, truncated: Any = None,
           mask: Any = None, cu_seqlens: Any = None, axis: int = -1, out: Any = None,
           backend: Any = "auto") -> VTraceResult:
    r"""The float64 reference of :func:`gaescan.vtrace`: a plain loop over time per row or segment.

    With ``ρ_t = min(rho_bar, e^{ℓ_t})``, ``c_t = λ_t min(c_bar, e^{ℓ_t})``,
    ``ρpg_t = min(pg_rho_bar, e^{ℓ_t})`` (``pg_rho_bar`` defaulting to
    ``rho_bar``): ``δ_t = ρ_t (r_t + γ_t (1 − term_t) V'_t − V_t)``,
    ``D_t = δ_t + γ_t (1 − done_t) c_t D_{τ(t)}`` (``last_trace`` past the last valid step),
    ``vs_t = V_t + D_t``, ``vs'_t = V'_t + (1 − done_t) D_{τ(t)}``,
    ``adv_t = ρpg_t (r_t + γ_t (1 − term_t) vs'_t − V_t)``.  Every ``(1 − flag)``
    is a select; a NaN in ``log_rhos`` stays NaN through the clipping.  The
    clipping thresholds are rounded to the output dtype, like γ and λ.

    Parameters
    ----------
    rewards, values, log_rhos, gamma, lam, rho_bar, c_bar, pg_rho_bar, next_values, last_value, last_trace, dones, terminated, truncated, mask, cu_seqlens, axis
        As for :func:`gaescan.vtrace`, in any array library.
    out, backend
        Ignored (accepted so that a call's keyword arguments can be reused).

    Returns
    -------
    VTraceResult
        ``(vs, advantages)`` as float64 NumPy arrays of the input shape.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> r = np.array([1.0, 0.0, 1.0]); v = np.array([0.5, 0.5, 0.5])
    >>> gaescan.testing.vtrace(r, v, np.zeros(3), gamma=1.0, dones=np.array([0, 1, 0])).vs
    array([1., 0., 1.])
    """
    dtype = result_dtype(rewards, values, log_rhos, next_values, last_value, last_trace, gamma, lam)
    rewards, values, log_rhos, next_values, last_value, last_trace, gamma, lam = map(
        _host, (rewards, values, log_rhos, next_values, last_value, last_trace, gamma, lam))
    dones, terminated, truncated, mask = map(_host, (dones, terminated, truncated, mask))
    rb = float(_rounded(rho_bar, dtype))
    cb = float(_rounded(c_bar, dtype))
    pb = rb if pg_rho_bar is None else float(_rounded(pg_rho_bar, dtype))
    shape = np.shape(rewards)
    if dones is not None:
        terminated, truncated = dones, None
    if cu_seqlens is not None or len(shape) == 0:
        axis = -1
    if len(shape) == 0:
        shape = (1,)
    rows = _Rows(shape, axis)
    g, lm = rows.take(_rounded(gamma, dtype)), rows.take(_rounded(lam, dtype))
    r, v, lr = rows.take(rewards), rows.take(values), rows.take(log_rhos)
    nv = None if next_values is None else rows.take(next_values)
    term = rows.flag(terminated, False)
    done = term | rows.flag(truncated, False)
    m = rows.flag(mask, True)
    if cu_seqlens is not None:
        lo, hi = _segments(cu_seqlens)
        cols = [(0, lo, hi, _per_segment(last_value, len(lo), dtype), _per_segment(last_trace, len(lo), dtype))]
    else:
        lv, lt = rows.boundary(last_value, dtype), rows.boundary(last_trace, dtype)
        cols = [(j, [0], [rows.T], lv[j:j + 1], lt[j:j + 1]) for j in range(rows.R)]
    vs = np.zeros(r.shape)
    adv = np.zeros(r.shape)
    for j, los, his, lvs, lts in cols:
        cr, cv, clr, ct, cd, cg, cl, cm = (x[:, j].tolist() for x in (r, v, lr, term, done, g, lm, m))
        cnv = None if nv is None else nv[:, j].tolist()
        vs_out, adv_out = [0.0] * rows.T, [0.0] * rows.T
        for s in range(len(los)):
            _vtrace_row(cr, cv, clr, cnv, ct, cd, cg, cl, cm, int(los[s]), int(his[s]), rb, cb, pb,
                        float(lvs[s]), float(lts[s]), vs_out, adv_out)
        vs[:, j], adv[:, j] = vs_out, adv_out
    return VTraceResult(rows.back(vs), rows.back(adv))


__all__ += ["VTraceResult", "vtrace"]


# ------------------------------------------------------------------ turn-level GAE


def _turn_gae_row(r, v, ids, m, g, gl, lv, adv, ret):
    """One row of turn-level GAE, literally: turns in id order, outputs in place."""
    turns: dict[int, list[int]] = {}
    for t in range(len(r)):
        if m[t]:
            turns.setdefault(int(ids[t]), []).append(t)
    a_next, u_next = 0.0, lv
    for k in sorted(turns, reverse=True):
        tokens = turns[k]
        rk = 0.0
        for t in tokens:
            rk += r[t]
        u = v[tokens[0]]
        a = rk + g * u_next - u if gl == 0 else rk + g * u_next - u + gl * a_next
        for t in tokens:
            adv[t] = a
            ret[t] = a + u
        a_next, u_next = a, u


def turn_gae(rewards: Any, values: Any, turn_ids: Any, *, gamma: Any, lam: Any, mask: Any = None,
             last_value: Any = None, axis: int = -1, out: Any = None, backend: Any = "auto") -> GAEResult:
    r"""The float64 reference of :func:`gaescan.turn_gae`.

    Per row, turn ``k`` is the set of valid tokens with id ``k``, turns in id
    order: ``R_k`` the sum of their rewards, ``U_k`` the value at the first
    one, ``A_k = R_k + γ U_{k+1} − U_k + γλ A_{k+1}`` (``U`` after the last
    turn = ``last_value``, ``A`` = 0); each token of turn ``k`` gets ``A_k``
    and ``A_k + U_k``, masked tokens 0.  The ids' order along time is not
    checked here.

    Parameters
    ----------
    rewards, values, turn_ids, gamma, lam, mask, last_value, axis
        As for :func:`gaescan.turn_gae`, in any array library.
    out, backend
        Ignored (accepted so that a call's keyword arguments can be reused).

    Returns
    -------
    GAEResult
        ``(advantages, returns)`` as float64 NumPy arrays of the input shape.

    Examples
    --------
    >>> import numpy as np, gaescan.testing
    >>> r = np.array([0.0, 1.0, 0.0, 0.0, 2.0]); v = np.array([0.5, 9.0, 1.0, 9.0, 9.0])
    >>> gaescan.testing.turn_gae(r, v, np.array([0, 0, 1, 1, 1]), gamma=1.0, lam=1.0).advantages
    array([2.5, 2.5, 1. , 1. , 1. ])
    """
    dtype = result_dtype(rewards, values, last_value, gamma, lam)
    rewards, values, turn_ids, mask, last_value, gamma, lam = map(
        _host, (rewards, values, turn_ids, mask, last_value, gamma, lam))
    shape = np.shape(rewards)
    rows = _Rows(shape, axis)
    g = rows.take(_rounded(gamma, dtype))
    gl = g * rows.take(_rounded(lam, dtype))
    r, v = rows.take(rewards), rows.take(values)
    ids = rows.take(turn_ids, np.int64)
    m = rows.flag(mask, True)
    lv = rows.boundary(last_value, dtype)
    adv = np.zeros(r.shape)
    ret = np.zeros(r.shape)
    for j in range(rows.R if rows.T else 0):
        a_out, r_out = [0.0] * rows.T, [0.0] * rows.T
        _turn_gae_row(r[:, j].tolist(), v[:, j].tolist(), ids[:, j].tolist(), m[:, j].tolist(),
                      float(g[0, j]), float(gl[0, j]), float(lv[j]), a_out, r_out)
        adv[:, j], ret[:, j] = a_out, r_out
    return GAEResult(rows.back(adv), rows.back(ret))


__all__ += ["turn_gae"]
