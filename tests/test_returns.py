"""gaescan.discounted_returns against the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    LONG_T,
    assert_close,
    assert_unchanged,
    assert_zero_where,
    random_cu_seqlens,
    random_data,
    random_flags,
    snapshot,
)

import gaescan.testing as gt


def check_returns(backend, dtype=None, **kw):
    snap = snapshot(kw)
    out = backend.returns(**kw)
    ref = gt.discounted_returns(**kw)
    if dtype is None:
        dtype = gt.result_dtype(kw["rewards"], kw["gamma"], kw.get("last_value"))
    assert_close(out, ref, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(out, kw["mask"])
    return out


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("with_dones", [False, True], ids=["nodones", "dones"])
def test_lengths(backend, rng, with_dones, masked):
    for T in backend.lengths():
        B = backend.batch(T, 3)
        kw = dict(rewards=random_data(rng, (B, T)), gamma=0.99, last_value=random_data(rng, (B,)))
        if with_dones:
            kw["dones"] = random_flags(rng, (B, T), 0.15)
        if masked:
            kw["mask"] = rng.random((B, T)) < 0.7
        check_returns(backend, **kw)


@pytest.mark.parametrize(
    "r_dtype, expected",
    [
        (np.float16, np.float32),
        (np.float32, np.float32),
        (np.float64, np.float64),
        (np.int32, np.float32),
        (np.int64, np.float32),
        (np.bool_, np.float32),
    ],
    ids=lambda x: np.dtype(x).name,
)
@pytest.mark.cudasim
def test_dtypes(backend, rng, r_dtype, expected):
    r = random_data(rng, (4, 50), r_dtype)
    out = check_returns(
        backend, expected, rewards=r, gamma=0.9, dones=random_flags(rng, (4, 50), 0.1, np.int8)
    )
    assert out.dtype == expected


@pytest.mark.cudasim
def test_float64_gamma_or_last_value_forces_float64(backend, rng):
    r = random_data(rng, (3, 20))
    check_returns(backend, np.float32, rewards=r, gamma=np.float64(0.9), last_value=np.float64(2.0))
    check_returns(backend, np.float64, rewards=r, gamma=np.full((3, 1), 0.9))
    check_returns(backend, np.float64, rewards=r, gamma=0.9, last_value=np.ones(3))
    check_returns(backend, np.float32, rewards=r, gamma=0.9, dones=np.zeros((3, 20)), mask=np.ones((3, 20)))


@pytest.mark.parametrize("form", ["scalar", "per-row", "per-step", "per-step-one", "zero", "one"])
@pytest.mark.cudasim
def test_gamma_forms(backend, rng, form):
    B, T = 4, 90
    g = {
        "scalar": 0.97,
        "per-row": rng.uniform(0.8, 1.0, (B, 1)).astype(np.float32),
        "per-step": rng.uniform(0.0, 1.0, (B, T)).astype(np.float32),
        "per-step-one": np.where(rng.random((B, T)) < 0.7, 1.0, 0.9).astype(np.float32),
        "zero": 0.0,
        "one": 1.0,
    }[form]
    check_returns(
        backend,
        rewards=random_data(rng, (B, T)),
        gamma=g,
        dones=random_flags(rng, (B, T), 0.05),
        mask=rng.random((B, T)) < 0.9,
        last_value=1.5,
    )


@pytest.mark.parametrize("extra", ["plain", "dones+mask", "per-step-gamma", "last_value"])
@pytest.mark.parametrize(
    "cu",
    [[0, 50], [0, 0, 3, 3, 10, 10], list(range(31)), [0, 0, 0], "random"],
    ids=["single", "empties", "many-ones", "all-empty", "random"],
)
@pytest.mark.cudasim
def test_cu_seqlens(backend, rng, cu, extra):
    cu = random_cu_seqlens(rng, 400, 23) if isinstance(cu, str) else np.array(cu)
    n, S = int(cu[-1]), len(cu) - 1
    kw = dict(rewards=random_data(rng, (n,)), gamma=0.95, cu_seqlens=cu)
    if extra == "dones+mask":
        kw["dones"] = random_flags(rng, (n,), 0.1)
        kw["mask"] = rng.random(n) < 0.8
    elif extra == "per-step-gamma":
        kw["gamma"] = rng.uniform(0.5, 1.0, n).astype(np.float32)
    elif extra == "last_value":
        kw["last_value"] = random_data(rng, (S,))
    check_returns(backend, **kw)


@pytest.mark.parametrize("layout", ["axis0", "3d-middle", "strided", "fortran"])
@pytest.mark.cudasim
def test_axes(backend, rng, layout):
    T = 41
    if layout == "axis0":
        r, axis = random_data(rng, (T, 5)), 0
    elif layout == "3d-middle":
        r, axis = random_data(rng, (2, T, 3)), 1
    elif layout == "strided":
        r, axis = random_data(rng, (5, 2 * T))[:, ::2], -1
    else:
        r, axis = np.asfortranarray(random_data(rng, (5, T))), -1
    batch = tuple(s for i, s in enumerate(r.shape) if i != axis % r.ndim)
    d = random_flags(rng, r.shape, 0.1)
    check_returns(backend, rewards=r, gamma=0.9, dones=d, axis=axis, last_value=random_data(rng, batch))


@pytest.mark.parametrize("out_kind", ["contiguous", "strided", "fortran"])
@pytest.mark.cudasim
def test_out(backend, rng, out_kind):
    r = random_data(rng, (4, 33), np.float64)
    if out_kind == "contiguous":
        out = np.full((4, 33), np.nan)
    elif out_kind == "strided":
        out = np.full((8, 66), np.nan)[::2, ::2]
    else:
        out = np.full((4, 33), np.nan, order="F")
    m = rng.random((4, 33)) < 0.8
    res = backend.returns(r, gamma=0.9, mask=m, out=out)
    assert res is out
    assert_close(out, gt.discounted_returns(r, gamma=0.9, mask=m), np.float64)
    assert_zero_where(out, m)


@pytest.mark.cudasim
def test_done_at_end_ignores_last_value(backend, rng):
    r = random_data(rng, (3, 10))
    d = np.zeros((3, 10), bool)
    d[:, -1] = True
    a = backend.returns(r, gamma=0.9, dones=d, last_value=np.array([1e30, np.inf, np.nan], np.float32))
    b = backend.returns(r, gamma=0.9, dones=d)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("with_flags", [False, True], ids=["plain", "dones+mask+cu"])
def test_equals_gae_with_zero_values_lam_one(backend, rng, with_flags):
    """G = A for V = 0, λ = 1 (both checked against the oracle too)."""
    n = 120
    r = random_data(rng, (n,))
    kw = dict(gamma=0.97, last_value=rng.standard_normal(4).astype(np.float32) if with_flags else 0.5)
    if with_flags:
        kw.update(
            dones=random_flags(rng, (n,), 0.1),
            mask=rng.random(n) < 0.8,
            cu_seqlens=np.array([0, 10, 10, 70, n]),
        )
    g = check_returns(backend, rewards=r, **kw)
    adv = backend.gae(r, np.zeros(n, np.float32), lam=1.0, **kw).advantages
    np.testing.assert_allclose(adv, g, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_row(cpu_backend, rng, dtype):
    T = LONG_T
    r = random_data(rng, (T,), dtype)
    check_returns(cpu_backend, rewards=r, gamma=1.0)
    check_returns(
        cpu_backend, rewards=r, gamma=0.999, dones=random_flags(rng, (T,), 1e-3), mask=rng.random(T) < 0.9
    )


@pytest.mark.cudasim
def test_zero_size(backend):
    for shape, axis in [((0,), -1), ((4, 0), -1), ((0, 3), 0), ((0, 3), -1)]:
        out = backend.returns(np.zeros(shape, np.float64), gamma=0.9, axis=axis)
        assert out.shape == shape and out.dtype == np.float64


def test_deterministic(backend, rng):
    r = random_data(rng, (4, 3000 if not backend.small else 300))
    d = random_flags(rng, r.shape, 0.01)
    first = backend.returns(r, gamma=0.999, dones=d)
    for _ in range(3):
        assert backend.returns(r, gamma=0.999, dones=d).tobytes() == first.tobytes()
