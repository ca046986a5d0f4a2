"""gaescan.linear_scan against the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LONG_T, assert_close, assert_unchanged, random_data, random_flags, snapshot

import gaescan.testing as gt

DIRS = [False, True]
DIR_IDS = ["forward", "reverse"]


def check_scan(backend, dtype=None, **kw):
    snap = snapshot(kw)
    y = backend.scan(**kw)
    if dtype is None:
        dtype = gt.result_dtype(kw["a"], kw["b"], kw.get("initial"))
    assert_close(y, gt.linear_scan(**kw), dtype)
    assert_unchanged(kw, snap)
    return y


def _a(form, rng, shape, dtype=np.float32):
    """Decay coefficients: any real values are allowed; keep |∏a| bounded."""
    B, T = shape
    if form == "scalar":
        return 0.9
    if form == "scalar-negative":
        return -0.95
    if form == "per-step":
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)
    if form == "per-step-with-zeros":
        return np.where(rng.random(shape) < 0.1, 0.0, rng.uniform(0.5, 1.0, shape)).astype(dtype)
    if form == "per-row":
        return rng.uniform(0.5, 1.0, (B, 1)).astype(dtype)
    if form == "per-time":
        return rng.uniform(0.5, 1.0, (T,)).astype(dtype)
    if form == "ones":
        return np.ones(shape, dtype)
    raise AssertionError(form)


A_FORMS = ["scalar", "scalar-negative", "per-step", "per-step-with-zeros", "per-row", "per-time", "ones"]


@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
def test_lengths(backend, rng, reverse):
    for T in backend.lengths():
        B = backend.batch(T, 3)
        a = rng.uniform(0.5, 1.0, (B, T)).astype(np.float32)
        check_scan(backend, a=a, b=random_data(rng, (B, T)), reverse=reverse, initial=random_data(rng, (B,)))


@pytest.mark.parametrize("form", A_FORMS)
@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
@pytest.mark.cudasim
def test_a_forms(backend, rng, reverse, form):
    B, T = (3, 70) if backend.small else (5, 301)
    check_scan(backend, a=_a(form, rng, (B, T)), b=random_data(rng, (B, T)), reverse=reverse)


@pytest.mark.parametrize(
    "b_dtype, a_dtype, expected",
    [
        (np.float16, np.float16, np.float32),
        (np.float32, np.float32, np.float32),
        (np.int64, np.float32, np.float32),
        (np.bool_, np.float32, np.float32),
        (np.float32, np.float64, np.float64),
        (np.float64, np.float32, np.float64),
    ],
    ids=lambda x: np.dtype(x).name,
)
@pytest.mark.cudasim
def test_dtypes(backend, rng, b_dtype, a_dtype, expected):
    b = random_data(rng, (3, 40), b_dtype)
    a = rng.uniform(0.5, 1.0, (3, 40)).astype(a_dtype)
    y = check_scan(backend, expected, a=a, b=b)
    assert y.dtype == expected


@pytest.mark.cudasim
def test_weak_scalars_and_float64_initial(backend, rng):
    b = random_data(rng, (3, 40))
    check_scan(backend, np.float32, a=np.float64(0.9), b=b, initial=np.float64(1.0))
    check_scan(backend, np.float64, a=0.9, b=b, initial=np.ones(3))


@pytest.mark.parametrize("kind", ["scalar", "per-row", "per-row-3d"])
@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
@pytest.mark.cudasim
def test_initial(backend, rng, reverse, kind):
    if kind == "per-row-3d":
        b, axis = random_data(rng, (2, 17, 3)), 1
        init = random_data(rng, (2, 3))
    else:
        b, axis = random_data(rng, (4, 17)), -1
        init = 2.5 if kind == "scalar" else random_data(rng, (4,))
    check_scan(backend, a=0.8, b=b, initial=init, reverse=reverse, axis=axis)


@pytest.mark.parametrize(
    "layout", ["axis0", "3d-middle", "3d-axis0", "strided", "fortran", "negative-stride"]
)
@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
@pytest.mark.cudasim
def test_axes(backend, rng, reverse, layout):
    T = 45
    if layout == "axis0":
        b, axis = random_data(rng, (T, 4)), 0
    elif layout == "3d-middle":
        b, axis = random_data(rng, (3, T, 2)), 1
    elif layout == "3d-axis0":
        b, axis = random_data(rng, (T, 3, 2)), 0
    elif layout == "strided":
        b, axis = random_data(rng, (8, 3 * T))[::2, ::3], -1
    elif layout == "fortran":
        b, axis = np.asfortranarray(random_data(rng, (4, T))), -1
    else:
        b, axis = random_data(rng, (4, T))[:, ::-1], -1
    a = rng.uniform(0.5, 1.0, b.shape).astype(np.float32)[..., ::-1].copy()
    check_scan(backend, a=a, b=b, axis=axis, reverse=reverse)


@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
@pytest.mark.cudasim
def test_out(backend, rng, reverse):
    b = random_data(rng, (4, 29))
    for out in (
        np.full((4, 29), np.nan, np.float32),
        np.full((4, 58), np.nan, np.float32)[:, 1::2],
        np.full((4, 29), np.nan, np.float32, order="F"),
    ):
        y = backend.scan(0.7, b, reverse=reverse, out=out)
        assert y is out
        assert_close(out, gt.linear_scan(0.7, b, reverse=reverse), np.float32)


def test_reverse_is_forward_on_flipped(backend, rng):
    a = rng.uniform(0.5, 1.0, (3, 50)).astype(np.float32)
    b = random_data(rng, (3, 50))
    fwd = backend.scan(a[:, ::-1].copy(), b[:, ::-1].copy())
    rev = backend.scan(a, b, reverse=True)
    np.testing.assert_allclose(rev, fwd[:, ::-1], rtol=1e-5, atol=1e-6)


def test_returns_is_reverse_scan(backend, rng):
    """discounted_returns with dones = reverse scan with a = γ·(1 − done)."""
    r = random_data(rng, (3, 80))
    d = random_flags(rng, (3, 80), 0.1)
    g = backend.returns(r, gamma=0.95, dones=d)
    y = backend.scan(np.where(d, 0.0, 0.95).astype(np.float32), r, reverse=True)
    np.testing.assert_allclose(g, y, rtol=1e-5, atol=1e-6)
    assert_close(y, gt.discounted_returns(r, gamma=0.95, dones=d), np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", DIRS, ids=DIR_IDS)
def test_long_row(cpu_backend, rng, reverse, dtype):
    a = rng.uniform(0.999, 1.0, LONG_T).astype(dtype)
    check_scan(cpu_backend, a=a, b=random_data(rng, (LONG_T,), dtype), reverse=reverse)
    check_scan(cpu_backend, a=1.0, b=random_data(rng, (LONG_T,), dtype), reverse=reverse, initial=3.0)


@pytest.mark.cudasim
def test_zero_size(backend):
    for shape in [(0,), (3, 0), (0, 4)]:
        y = backend.scan(0.5, np.zeros(shape, np.float32))
        assert y.shape == shape and y.dtype == np.float32


def test_deterministic(backend, rng):
    a = rng.uniform(0.9, 1.0, (4, 2000)).astype(np.float32)
    b = random_data(rng, (4, 2000))
    if backend.small:
        a, b = a[:, :300], b[:, :300]
    first = backend.scan(a, b)
    for _ in range(3):
        assert backend.scan(a, b).tobytes() == first.tobytes()
