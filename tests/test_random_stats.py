"""Random problems for the statistics and turn-level functions on the CPU backends.

Each problem draws the function (``group_normalize``, ``whiten`` with
``moments``, ``turn_gae``), its sizes, its options (``leave_one_out``,
``scale``, ``ddof`` 0–2, ``eps`` including 0, given moments, labels or
``group_size``, masks as bool, float or int8, per-row γ, ``last_value``,
``axis=0``), values with large means, tiny magnitudes or equal entries, NaN
and ±inf entries, and array layouts (C, Fortran, strided views).  Each result
is compared with the float64 references of :mod:`gaescan.testing`, non-finite
entries exactly; inputs must stay unchanged.  The backends are those of
``GAESCAN_TEST_BACKENDS`` among numba and numpy, and Dask for
``group_normalize`` and ``whiten``.

Marked ``slow`` (CI's slow stage runs it).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import selected_backend_names

import gaescan
import gaescan.testing as gt

pytestmark = pytest.mark.slow

BACKENDS = [b for b in selected_backend_names() if b in ("numba", "numpy")]
N_PROBLEMS = 80


def _layout(g, x):
    """``x`` or the same numbers in Fortran order or as a strided view."""
    k = int(g.integers(0, 3))
    if x.ndim == 0 or k == 0:
        return x
    if k == 1:
        return np.asfortranarray(x)
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., 1::2] = x
    return wide[..., 1::2]


def _values(g, shape, dtype):
    """Normal values around a mean of 0, a large one (float32), a tiny scale, or all equal;
    one or two NaN / ±inf entries in a fifth of the draws."""
    kind = int(g.integers(0, 4))
    if kind == 0:
        x = g.standard_normal(shape)
    elif kind == 1:
        x = (1e4 if dtype == np.float32 else 1e2) + g.standard_normal(shape)
    elif kind == 2:
        x = 1e-30 * (1 + 0.1 * g.standard_normal(shape))
    else:
        x = np.full(shape, 0.75)
    x = x.astype(dtype)
    if x.size and g.random() < 0.2:
        x.reshape(-1)[g.integers(0, x.size, int(g.integers(1, 3)))] = g.choice([np.nan, np.inf, -np.inf])
    return x


def _check(got, want, dtype):
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == np.shape(want)
    gt.assert_close(got, want, dtype=dtype)


def _dask(g, x):
    da = pytest.importorskip("dask.array")
    return da.from_array(x, chunks=tuple(int(g.integers(1, n + 1)) for n in x.shape))


def _group_problem(g):
    B = int(g.choice([1, 2, 3, 5, 17, 64, 1000]))
    dtype = np.dtype(g.choice([np.float32, np.float64]))
    kw = dict(leave_one_out=bool(g.random() < 0.5), scale=bool(g.random() < 0.6),
              ddof=int(g.integers(0, 3)), eps=float(g.choice([1e-6, 0.0, 0.5])))
    if g.random() < 0.5:
        kw["group_size"] = int(g.choice([d for d in range(1, B + 1) if B % d == 0]))
    else:
        n = int(g.integers(1, B + 1))
        kw["groups"] = _layout(g, (g.integers(-n, n, B) * int(g.choice([1, 1000003]))).astype(np.int64))
    return _layout(g, _values(g, (B,), dtype)), kw, dtype


def _whiten_problem(g):
    shape = tuple(int(g.choice([1, 2, 3, 7, 31, 257])) for _ in range(int(g.integers(1, 4))))
    dtype = np.dtype(g.choice([np.float32, np.float64]))
    x = _values(g, shape, dtype)
    mask = None
    if g.random() < 0.7:
        m = g.random(shape) < g.choice([0.0, 0.01, 0.5, 1.0])
        x = np.where(m, x, np.nan).astype(dtype)  # masked elements are never read
        mask = _layout(g, m.astype(g.choice([bool, np.float32, np.int8])))
    kw = dict(shift_mean=bool(g.random() < 0.7), ddof=int(g.integers(0, 3)), eps=float(g.choice([1e-8, 0.0, 0.3])))
    if g.random() < 0.2:
        kw["moments"] = gt.moments(x[..., :1], None if mask is None else mask[..., :1])
    return _layout(g, x), mask, kw, dtype


def _turn_problem(g):
    R, T = int(g.choice([1, 2, 3, 8])), int(g.choice([1, 2, 5, 17, 64, 129, 1000]))
    dtype = np.dtype(g.choice([np.float32, np.float64]))
    r, v = _values(g, (R, T), dtype), _values(g, (R, T), dtype)
    ids = np.sort(g.integers(0, int(g.integers(1, T + 1)), (R, T)), axis=1) * int(g.choice([1, 3])) - 5
    kw = dict(gamma=float(g.choice([0.99, 1.0, 0.5, 0.0])), lam=float(g.choice([0.95, 1.0, 0.3, 0.0])))
    if g.random() < 0.5:
        mask = g.random((R, T)) < g.choice([1.0, 0.7, 0.1])
        ids = np.where(mask, ids, g.integers(-99, 99, (R, T)))  # ids at masked tokens are never read
        kw["mask"] = mask
    ids = ids.astype(g.choice([np.int64, np.int32, np.int16]))
    if g.random() < 0.3:
        kw["gamma"] = np.where(g.random((R, 1)) < 0.2, 0.0, g.uniform(0.1, 1.0, (R, 1))).astype(dtype)
    if g.random() < 0.5:
        kw["last_value"] = g.standard_normal(R).astype(dtype) if g.random() < 0.5 else float(g.standard_normal())
    arrays = [r, v, ids]
    if g.random() < 0.3:  # time along axis 0
        arrays = [a.T.copy() for a in arrays]
        kw = {k: (a.T.copy() if isinstance(a, np.ndarray) and a.ndim == 2 else a) for k, a in kw.items()}
        kw["axis"] = 0
    return [_layout(g, a) for a in arrays], kw, dtype


@pytest.mark.parametrize("seed", range(N_PROBLEMS))
def test_group_normalize(seed):
    g = np.random.default_rng(20261207 + seed)
    s, kw, dtype = _group_problem(g)
    before = s.copy()
    want = gt.group_normalize(s, **kw)
    for be in BACKENDS:
        _check(gaescan.group_normalize(s, backend=be, **kw), want, dtype)
    dkw = {k: (_dask(g, a) if isinstance(a, np.ndarray) else a) for k, a in kw.items()}
    _check(np.asarray(gaescan.group_normalize(_dask(g, s), **dkw).compute()), want, dtype)
    np.testing.assert_array_equal(s, before)


@pytest.mark.parametrize("seed", range(N_PROBLEMS))
def test_whiten_and_moments(seed):
    g = np.random.default_rng(20261208 + seed)
    x, mask, kw, dtype = _whiten_problem(g)
    before = x.copy()
    want, want_m = gt.whiten(x, mask, **kw), gt.moments(x, mask)
    for be in BACKENDS:
        y = gaescan.whiten(x, mask, backend=be, **kw)
        _check(y, want, dtype)
        if mask is not None:
            assert np.all(y[np.asarray(mask) == 0] == 0)
        m = gaescan.moments(x, mask, backend=be)
        assert float(m.count) == float(want_m.count)
        if np.isfinite(float(want_m.mean)):
            np.testing.assert_allclose([float(m.mean), float(m.m2)], [float(want_m.mean), float(want_m.m2)],
                                       rtol=1e-9, atol=1e-300)
        else:  # an infinite element: Chan's merge may meet inf − inf where the sum does not
            assert not np.isfinite(float(m.mean)) and np.isnan(float(m.m2))
    dm = None if mask is None else _dask(g, np.ascontiguousarray(mask))
    _check(np.asarray(gaescan.whiten(_dask(g, x), dm, **kw).compute()), want, dtype)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("seed", range(N_PROBLEMS))
def test_turn_gae(seed):
    g = np.random.default_rng(20261209 + seed)
    (r, v, ids), kw, dtype = _turn_problem(g)
    before = [a.copy() for a in (r, v, ids)]
    want = gt.turn_gae(r, v, ids, **kw)
    # The returns A + U cancel where the rewards are tiny beside the values: where their
    # own relative error misses, they must be within the tolerance of the magnitudes
    # that enter them (the values and the rows' reward sums).
    finite = np.isfinite(r) & np.isfinite(v)
    scale = float(np.max(np.abs(np.where(finite, v, 0)), initial=0.0)
                  + np.max(np.sum(np.abs(np.where(finite, r, 0)), axis=kw.get("axis", -1)), initial=0.0))
    for be in BACKENDS:
        adv, ret = gaescan.turn_gae(r, v, ids, backend=be, **kw)
        _check(adv, want.advantages, dtype)
        fin = np.isfinite(want.returns)
        with np.errstate(invalid="ignore"):  # the unselected inf − inf
            err = float(np.max(np.abs(np.where(fin, ret - want.returns, 0)), initial=0.0))
        if np.isfinite(ret[fin]).all() and err <= gt.tolerance(dtype) * scale:
            np.testing.assert_array_equal(ret[~fin], want.returns[~fin])  # NaN matches NaN
        else:
            _check(ret, want.returns, dtype)
    for a, b in zip((r, v, ids), before, strict=True):
        np.testing.assert_array_equal(a, b)
