"""gaescan.gae against the oracle, over backends, dtypes, lengths, flags,
masks, packing, coefficient shapes, axes, last_value and out=."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    FLAG_MODES,
    LONG_T,
    assert_close,
    assert_unchanged,
    assert_zero_where,
    flag_kwargs,
    random_cu_seqlens,
    random_data,
    random_flags,
    snapshot,
)

import gaescan
import gaescan.testing as gt


def check_gae(backend, dtype=None, **kw):
    """Run gae on ``backend`` and compare both outputs with the oracle."""
    snap = snapshot(kw)
    res = backend.gae(**kw)
    assert isinstance(res, gaescan.GAEResult)
    ref_adv, ref_ret = gt.gae(**kw)
    if dtype is None:
        dtype = gt.result_dtype(
            kw["rewards"], kw["values"], kw.get("next_values"), kw.get("last_value"),
            kw.get("last_advantage"), kw["gamma"], kw["lam"],
        )
    assert_close(res.advantages, ref_adv, dtype)
    assert_close(res.returns, ref_ret, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(res.advantages, kw["mask"])
        assert_zero_where(res.returns, kw["mask"])
    return res


@pytest.mark.parametrize("mode", FLAG_MODES)
@pytest.mark.cudasim
def test_lengths_and_flags(backend, rng, mode):
    """Every length across chunk boundaries, for each way of passing episode ends."""
    for T in backend.lengths():
        B = backend.batch(T, 3)
        r = random_data(rng, (B, T))
        v = random_data(rng, (B, T))
        kw = flag_kwargs(mode, rng, (B, T), v)
        lv = {} if "next_values" in kw else {"last_value": random_data(rng, (B,))}
        check_gae(backend, rewards=r, values=v, gamma=0.99, lam=0.95, **kw, **lv)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("mode", FLAG_MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.cudasim
def test_flags_masks_dtypes(backend, rng, dtype, mode, masked):
    B, T = (3, 61) if backend.small else (6, 203)
    r = random_data(rng, (B, T), dtype)
    v = random_data(rng, (B, T), dtype)
    kw = flag_kwargs(mode, rng, (B, T), v, p=0.2)
    if masked:
        m = rng.random((B, T)) < 0.7
        m[0] = False  # a fully masked row
        m[1] = True  # an unmasked row
        kw["mask"] = m
    check_gae(backend, rewards=r, values=v, gamma=0.97, lam=0.9, **kw)


@pytest.mark.parametrize("flag_dtype", [bool, np.int8, np.int32, np.uint8, np.float32, np.float64])
@pytest.mark.cudasim
def test_flag_dtypes_nonzero_is_true(backend, rng, flag_dtype):
    B, T = 3, 40
    r, v, nv = (random_data(rng, (B, T)) for _ in range(3))
    kw = dict(
        terminated=random_flags(rng, (B, T), 0.1, flag_dtype),
        truncated=random_flags(rng, (B, T), 0.1, flag_dtype),
        mask=random_flags(rng, (B, T), 0.8, flag_dtype),
    )
    if np.dtype(flag_dtype).kind == "f":
        kw["mask"] = np.where(kw["mask"] != 0, 0.25, 0.0).astype(flag_dtype)
    res = check_gae(backend, rewards=r, values=v, next_values=nv, gamma=0.9, lam=0.8, **kw)
    # same numbers as with boolean flags, and flags never change the dtype
    as_bool = {k: x != 0 for k, x in kw.items()}
    res_b = backend.gae(r, v, next_values=nv, gamma=0.9, lam=0.8, **as_bool)
    assert res.advantages.dtype == np.float32
    np.testing.assert_array_equal(res.advantages, res_b.advantages)
    np.testing.assert_array_equal(res.returns, res_b.returns)


@pytest.mark.parametrize(
    "r_dtype, v_dtype, expected",
    [
        (np.float16, np.float16, np.float32),
        (np.float16, np.float32, np.float32),
        (np.float32, np.float32, np.float32),
        (np.int32, np.float32, np.float32),
        (np.int64, np.int64, np.float32),
        (np.bool_, np.float32, np.float32),
        (np.float32, np.float64, np.float64),
        (np.float64, np.float16, np.float64),
        (np.int64, np.float64, np.float64),
    ],
    ids=lambda x: np.dtype(x).name,
)
@pytest.mark.cudasim
def test_dtypes(backend, rng, r_dtype, v_dtype, expected):
    B, T = 4, 37
    r = random_data(rng, (B, T), r_dtype)
    v = random_data(rng, (B, T), v_dtype)
    d = random_flags(rng, (B, T), 0.1)
    res = check_gae(backend, expected, rewards=r, values=v, gamma=0.99, lam=0.95, dones=d)
    assert res.advantages.dtype == res.returns.dtype == expected


@pytest.mark.cudasim
def test_float64_coefficients_and_last_value_force_float64(backend, rng):
    r, v = random_data(rng, (3, 20)), random_data(rng, (3, 20))
    f64 = np.float64
    # scalars (Python and NumPy) are weak
    check_gae(backend, np.float32, rewards=r, values=v, gamma=f64(0.9), lam=f64(0.8), last_value=f64(1.5))
    # float64 arrays are not
    check_gae(backend, f64, rewards=r, values=v, gamma=np.full((3, 1), 0.9), lam=0.8)
    check_gae(backend, f64, rewards=r, values=v, gamma=0.9, lam=np.full((3, 20), 0.8))
    check_gae(backend, f64, rewards=r, values=v, gamma=0.9, lam=0.8, last_value=np.ones(3))
    check_gae(
        backend, f64, rewards=r, values=v, gamma=0.9, lam=0.8, next_values=random_data(rng, (3, 20), f64)
    )
    # flags never do
    check_gae(backend, np.float32, rewards=r, values=v, gamma=0.9, lam=0.8, dones=np.zeros((3, 20)))


COEF_FORMS = ["scalar", "per-row", "per-step", "per-step-one", "row-vector"]


def _coef(form, rng, B, T, lo, hi, dtype):
    if form == "scalar":
        return float(rng.uniform(lo, hi))
    if form == "per-row":
        return rng.uniform(lo, hi, (B, 1)).astype(dtype)
    if form == "per-step":
        return rng.uniform(lo, hi, (B, T)).astype(dtype)
    if form == "per-step-one":  # γλ reaching 1 on many steps
        return np.where(rng.random((B, T)) < 0.5, 1.0, rng.uniform(lo, hi, (B, T))).astype(dtype)
    if form == "row-vector":  # one value per time step, shared by the batch
        return rng.uniform(lo, hi, (T,)).astype(dtype)
    raise AssertionError(form)


@pytest.mark.parametrize("lam_form", COEF_FORMS)
@pytest.mark.parametrize("gamma_form", COEF_FORMS)
@pytest.mark.cudasim
def test_gamma_lam_forms(backend, rng, gamma_form, lam_form):
    B, T = (3, 45) if backend.small else (5, 150)
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    g = _coef(gamma_form, rng, B, T, 0.8, 1.0, np.float32)
    lam = _coef(lam_form, rng, B, T, 0.5, 1.0, np.float32)
    d = random_flags(rng, (B, T), 0.05)
    m = rng.random((B, T)) < 0.9
    check_gae(backend, rewards=r, values=v, gamma=g, lam=lam, dones=d, mask=m)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.0, 0.95), (0.99, 0.0), (0.0, 0.0), (1.0, 0.5)])
@pytest.mark.cudasim
def test_boundary_coefficients(backend, rng, gamma, lam):
    B, T = 3, 70
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    kw = flag_kwargs("term+trunc", rng, (B, T), v)
    check_gae(backend, rewards=r, values=v, gamma=gamma, lam=lam, **kw)


def test_gamma_is_rounded_to_output_dtype(backend):
    # γ = 0.1 is not a float32: the float32 result uses float32(0.1)
    z = np.zeros((1, 1), np.float32)
    res = backend.gae(z, z, gamma=0.1, lam=1.0, last_value=1.0)
    assert res.advantages[0, 0] == np.float32(0.1)


# ------------------------------------------------------------------ cu_seqlens


def _packing(kind, rng, small):
    """(cu_seqlens, N) for a packing kind."""
    if kind == "single":
        n = 97
        return np.array([0, n]), n
    if kind == "empty-ends":
        return np.array([0, 0, 0, 5, 5, 17, 40, 40, 40]), 40
    if kind == "many-ones":
        n = 60
        return np.arange(n + 1), n
    if kind == "ones-and-empties":
        return np.array([0, 1, 1, 2, 3, 3, 3, 4]), 4
    if kind == "all-empty":
        return np.array([0, 0, 0]), 0
    if kind == "random":
        n = 300 if small else 1500
        return random_cu_seqlens(rng, n, 37), n
    if kind == "long-segments":
        n = 700 if small else 5000
        return np.array([0, 3, 260, 261, n - 300, n]), n
    raise AssertionError(kind)


PACKINGS = ["single", "empty-ends", "many-ones", "ones-and-empties", "all-empty", "random", "long-segments"]
CU_EXTRAS = ["plain", "dones+mask", "term+trunc", "per-step-coefs", "last_value", "int32-offsets"]


@pytest.mark.parametrize("extra", CU_EXTRAS)
@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.cudasim
def test_cu_seqlens(backend, rng, packing, extra):
    cu, n = _packing(packing, rng, backend.small)
    S = len(cu) - 1
    r, v = random_data(rng, (n,)), random_data(rng, (n,))
    kw = dict(rewards=r, values=v, gamma=0.98, lam=0.93, cu_seqlens=cu)
    if extra == "dones+mask":
        kw["dones"] = random_flags(rng, (n,), 0.1)
        kw["mask"] = rng.random(n) < 0.75
    elif extra == "term+trunc":
        kw.update(flag_kwargs("term+trunc", rng, (n,), v, p=0.2))
    elif extra == "per-step-coefs":
        kw["gamma"] = rng.uniform(0.9, 1.0, n).astype(np.float32)
        kw["lam"] = np.where(rng.random(n) < 0.3, 1.0, 0.9).astype(np.float32)
    elif extra == "last_value":
        kw["last_value"] = random_data(rng, (S,))
    elif extra == "int32-offsets":
        kw["cu_seqlens"] = cu.astype(np.int32)
        kw["last_value"] = 2.5
    check_gae(backend, **kw)


@pytest.mark.cudasim
def test_cu_seqlens_equals_separate_rows(backend, rng):
    cu = np.array([0, 7, 7, 20, 21, 64])
    n = 64
    r, v = random_data(rng, (n,)), random_data(rng, (n,))
    d = random_flags(rng, (n,), 0.1)
    lv = random_data(rng, (5,))
    packed = backend.gae(r, v, gamma=0.9, lam=0.7, dones=d, last_value=lv, cu_seqlens=cu)
    for s in range(5):
        sl = slice(cu[s], cu[s + 1])
        one = backend.gae(r[sl], v[sl], gamma=0.9, lam=0.7, dones=d[sl], last_value=lv[s])
        np.testing.assert_allclose(packed.advantages[sl], one.advantages, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(packed.returns[sl], one.returns, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------ axes


LAYOUTS = [
    "axis0-time-major",
    "3d-middle-axis",
    "3d-axis0",
    "negative-axis",
    "strided",
    "fortran",
    "reversed-view",
]


def _layout(layout, rng, small):
    """(rewards, values, axis): arrays in a given memory layout / time axis."""
    B, T = (4, 37) if small else (6, 131)
    if layout == "axis0-time-major":
        return random_data(rng, (T, B)), random_data(rng, (T, B)), 0
    if layout == "3d-middle-axis":
        return random_data(rng, (2, T, 3)), random_data(rng, (2, T, 3)), 1
    if layout == "3d-axis0":
        return random_data(rng, (T, 2, 3)), random_data(rng, (T, 2, 3)), 0
    if layout == "negative-axis":
        return random_data(rng, (2, T, 3)), random_data(rng, (2, T, 3)), -2
    if layout == "strided":
        big_r, big_v = random_data(rng, (B, 2 * T)), random_data(rng, (B, 2 * T))
        return big_r[:, ::2], big_v[::-1, 1::2], -1
    if layout == "fortran":
        return (np.asfortranarray(random_data(rng, (B, T))), np.asfortranarray(random_data(rng, (B, T))), -1)
    if layout == "reversed-view":
        return random_data(rng, (B, T))[:, ::-1], random_data(rng, (B, T))[::-1], 1
    raise AssertionError(layout)


@pytest.mark.parametrize("with_extras", [False, True], ids=["plain", "flags+mask+perrow"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.cudasim
def test_axes_and_layouts(backend, rng, layout, with_extras):
    r, v, axis = _layout(layout, rng, backend.small)
    kw = dict(rewards=r, values=v, gamma=0.99, lam=0.9, axis=axis)
    if with_extras:
        shape = r.shape
        kw.update(flag_kwargs("term+trunc", rng, shape, v))
        kw["next_values"] = np.asfortranarray(kw["next_values"])
        kw["mask"] = (rng.random(shape) < 0.8)[..., ::-1]
        gshape = [1] * r.ndim
        gshape[axis] = shape[axis]  # a per-step γ shared by the batch, broadcast along other axes
        kw["gamma"] = rng.uniform(0.9, 1.0, gshape).astype(np.float32)
        lshape = list(shape)
        lshape[axis] = 1  # a per-row λ
        kw["lam"] = rng.uniform(0.8, 1.0, lshape).astype(np.float32)
    check_gae(backend, **kw)


@pytest.mark.cudasim
def test_time_major_matches_transposed(backend, rng):
    r, v = random_data(rng, (5, 77)), random_data(rng, (5, 77))
    d = random_flags(rng, (5, 77), 0.1)
    lv = random_data(rng, (5,))
    a = backend.gae(r, v, gamma=0.9, lam=0.9, dones=d, last_value=lv)
    b = backend.gae(r.T.copy(), v.T.copy(), gamma=0.9, lam=0.9, dones=d.T.copy(), last_value=lv, axis=0)
    np.testing.assert_allclose(b.advantages, a.advantages.T, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ last_value


@pytest.mark.parametrize("kind", ["scalar", "numpy-scalar", "per-row", "per-row-3d", "done-at-end"])
@pytest.mark.cudasim
def test_last_value(backend, rng, kind):
    B, T = 4, 29
    shape = (B, T)
    axis = -1
    if kind == "scalar":
        lv = 3.25
    elif kind == "numpy-scalar":
        lv = np.float32(-1.5)
    elif kind == "per-row":
        lv = random_data(rng, (B,))
    elif kind == "per-row-3d":
        shape, axis = (3, T, 2), 1
        lv = random_data(rng, (3, 2))
    else:
        lv = random_data(rng, (B,)) * 100
    r, v = random_data(rng, shape), random_data(rng, shape)
    d = random_flags(rng, shape, 0.05)
    if kind == "done-at-end":
        d[:, -1] = True  # last_value must not be read for these rows
        d[0, -1] = False
    res = check_gae(backend, rewards=r, values=v, gamma=0.95, lam=0.9, dones=d, last_value=lv, axis=axis)
    if kind == "done-at-end":
        base = backend.gae(r, v, gamma=0.95, lam=0.9, dones=d)
        np.testing.assert_array_equal(res.advantages[1:], base.advantages[1:])


# -------------------------------------------------------------- last_advantage


LAST_ADV = ["scalar", "per-row", "float64-forces-f64", "mask-at-end", "time-major",
            "next_values", "done-at-end-nan", "packed", "packed-masked-ends"]


@pytest.mark.parametrize("kind", LAST_ADV)
@pytest.mark.cudasim
def test_last_advantage(backend, rng, kind):
    """A_T = last_advantage carries into the row (a select on done, like every cut)."""
    B, T = 5, 45
    shape, axis = (B, T), -1
    kw = dict(gamma=0.97, lam=0.9)
    if kind == "time-major":
        shape, axis = (T, B), 0
    r, v = random_data(rng, shape), random_data(rng, shape)
    kw.update(rewards=r, values=v, axis=axis, dones=random_flags(rng, shape, 0.05))
    kw["last_advantage"] = random_data(rng, (B,)) * 3
    kw["last_value"] = random_data(rng, (B,))
    if kind == "scalar":
        kw["last_advantage"] = -2.5
    elif kind == "float64-forces-f64":
        kw["last_advantage"] = np.float64(1.25)
    elif kind == "mask-at-end":
        m = rng.random(shape) < 0.7
        m[:, -6:] = False  # the carry passes through masked positions
        m[0, :] = False
        kw["mask"] = m
    elif kind == "next_values":
        del kw["dones"], kw["last_value"]
        kw.update(flag_kwargs("term+trunc", rng, shape, v, p=0.1))
    elif kind == "done-at-end-nan":
        kw["dones"][:, -1] = True
        kw["dones"][0, -1] = False
        la = np.full(B, np.nan, dtype=np.float32)
        la[0] = 1.5
        kw["last_advantage"] = la
    elif kind.startswith("packed"):
        cu = np.array([0, 10, 10, 11, 30, 45])
        n, S = 45, 5
        r, v = random_data(rng, (n,)), random_data(rng, (n,))
        kw.update(rewards=r, values=v, axis=-1, cu_seqlens=cu, dones=random_flags(rng, (n,), 0.1),
                  last_value=random_data(rng, (S,)), last_advantage=random_data(rng, (S,)) * 3)
        if kind == "packed-masked-ends":
            m = rng.random(n) < 0.7
            m[[9, 10, 28, 29, 44]] = False
            kw["mask"] = m
    res = check_gae(backend, **kw)
    if kind == "done-at-end-nan":
        assert np.isfinite(res.advantages[1:]).all()


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "mask"])
@pytest.mark.cudasim
def test_last_advantage_joins_slices(backend, rng, masked):
    """A row cut in two: the head slice, given the tail's first advantage and value,
    reproduces the whole row (the carry API's contract in its simplest form)."""
    B, T, cut = 4, 90, 37
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d = random_flags(rng, (B, T), 0.05)
    lv = random_data(rng, (B,))
    kw = dict(gamma=0.99, lam=0.95)
    if masked:
        m = np.ones((B, T), dtype=bool)
        m[:, cut - 3:cut + 1] = False  # the join falls inside masked positions
        kw["mask"] = m
    whole = backend.gae(r, v, dones=d, last_value=lv, **kw)
    tail_kw = {k: (x[:, cut:] if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    head_kw = {k: (x[:, :cut] if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    tail = backend.gae(r[:, cut:], v[:, cut:], dones=d[:, cut:], last_value=lv, **tail_kw)
    first = cut + 1 if masked else cut  # the tail's first valid position
    head = backend.gae(r[:, :cut], v[:, :cut], dones=d[:, :cut], last_value=v[:, first],
                       last_advantage=tail.advantages[:, first - cut], **head_kw)
    np.testing.assert_allclose(head.advantages, whole.advantages[:, :cut], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(head.returns, whole.returns[:, :cut], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(tail.advantages, whole.advantages[:, cut:], rtol=2e-5, atol=2e-5)


# -------------------------------------------------------------------------- out


@pytest.mark.parametrize("out_kind", ["contiguous", "strided", "fortran", "time-major-view"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.cudasim
def test_out(backend, rng, dtype, out_kind):
    B, T = 5, 53
    r, v = random_data(rng, (B, T), dtype), random_data(rng, (B, T), dtype)
    d = random_flags(rng, (B, T), 0.1)
    m = rng.random((B, T)) < 0.8
    if out_kind == "contiguous":
        outs = (np.full((B, T), np.nan, dtype), np.full((B, T), np.nan, dtype))
    elif out_kind == "strided":
        outs = (np.full((B, 2 * T), 7.0, dtype)[:, ::2], np.full((2 * B, T), 7.0, dtype)[::2])
    elif out_kind == "fortran":
        outs = (np.full((B, T), 7.0, dtype, order="F"), np.full((B, T), 7.0, dtype, order="F"))
    else:
        outs = (np.full((T, B), 7.0, dtype).T, np.full((T, B), 7.0, dtype).T)
    res = backend.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m, out=outs)
    assert res.advantages is outs[0] and res.returns is outs[1]
    ref_adv, ref_ret = gt.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m)
    assert_close(outs[0], ref_adv, dtype)
    assert_close(outs[1], ref_ret, dtype)
    assert_zero_where(outs[0], m)
    assert_zero_where(outs[1], m)


@pytest.mark.cudasim
def test_out_strided_leaves_gaps_alone(backend, rng):
    r, v = random_data(rng, (3, 20)), random_data(rng, (3, 20))
    base_a, base_r = np.full((3, 40), 7.0, np.float32), np.full((3, 40), 7.0, np.float32)
    backend.gae(r, v, gamma=0.9, lam=0.9, out=(base_a[:, 1::2], base_r[:, ::2]))
    assert np.all(base_a[:, ::2] == 7.0) and np.all(base_r[:, 1::2] == 7.0)


# ------------------------------------------------------------------- long rows


@pytest.mark.slow
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (1.0, 1.0)], ids=["typical", "gl=1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_row(cpu_backend, rng, dtype, gamma, lam):
    r = random_data(rng, (LONG_T,), dtype)
    v = random_data(rng, (LONG_T,), dtype)
    check_gae(cpu_backend, rewards=r, values=v, gamma=gamma, lam=lam, last_value=0.5)


@pytest.mark.slow
def test_long_row_flags_mask(cpu_backend, rng):
    T = LONG_T
    r, v = random_data(rng, (T,)), random_data(rng, (T,))
    kw = flag_kwargs("term+trunc", rng, (T,), v, p=0.001)
    kw["mask"] = rng.random(T) < 0.9
    check_gae(cpu_backend, rewards=r, values=v, gamma=1.0, lam=1.0, **kw)


# --------------------------------------------------------------------- others


@pytest.mark.parametrize(
    "shape, axis",
    [((0,), -1), ((3, 0), -1), ((0, 5), -1), ((0, 5), 0), ((2, 0, 3), 1)],
    ids=str,
)
@pytest.mark.cudasim
def test_zero_size(backend, shape, axis):
    for dtype in (np.float32, np.float64):
        z = np.zeros(shape, dtype)
        res = backend.gae(z, z, gamma=0.9, lam=0.9, axis=axis)
        for out in res:
            assert isinstance(out, np.ndarray) and out.shape == shape and out.dtype == dtype


@pytest.mark.cudasim
def test_zero_size_packed(backend):
    z = np.zeros(0, np.float32)
    res = backend.gae(z, z, gamma=0.9, lam=0.9, cu_seqlens=np.array([0]))
    assert res.advantages.shape == (0,) and res.advantages.dtype == np.float32


def test_accepts_lists(backend):
    res = backend.gae([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], gamma=0.5, lam=0.5, last_value=2.0)
    np.testing.assert_allclose(res.advantages, [1.0625, 2.25, 3.0])


def test_result_is_namedtuple(backend, rng):
    r, v = random_data(rng, (2, 5)), random_data(rng, (2, 5))
    res = backend.gae(r, v, gamma=0.9, lam=0.9)
    adv, ret = res
    assert res._fields == ("advantages", "returns")
    assert adv is res.advantages and ret is res.returns
    np.testing.assert_allclose(ret - adv, v, rtol=1e-6, atol=1e-6)


def test_deterministic(backend, rng):
    B, T = (3, 300) if backend.small else (8, 5000)
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    kw = flag_kwargs("term+trunc", rng, (B, T), v)
    m = rng.random((B, T)) < 0.9
    first = backend.gae(r, v, gamma=0.99, lam=0.95, mask=m, **kw)
    for _ in range(3):
        again = backend.gae(r, v, gamma=0.99, lam=0.95, mask=m, **kw)
        assert again.advantages.tobytes() == first.advantages.tobytes()
        assert again.returns.tobytes() == first.returns.tobytes()


def test_auto_backend_is_numba_for_numpy(rng, monkeypatch):
    # The commonest call (C-contiguous float32 NumPy, scalar γ and λ, dones)
    # goes through the dispatcher, which picks "numba", and the numba module runs it.
    from gaescan import _dispatch, _kept
    from gaescan.backends import numba_cpu

    chosen, ran = [], []
    _kept.clear()  # a call kept by an earlier test would skip the route
    real_choose, real_gae, real_kept = _dispatch.choose, numba_cpu.gae, numba_cpu.gae_kept
    monkeypatch.setattr(_dispatch, "choose", lambda b, ctx: chosen.append(b) or real_choose(b, ctx))
    # a call that may be kept runs through gae_kept, which returns its replay
    monkeypatch.setattr(numba_cpu, "gae", lambda p: ran.append(p.rows.dtype) or real_gae(p))
    monkeypatch.setattr(numba_cpu, "gae_kept", lambda p: ran.append(p.rows.dtype) or real_kept(p))
    r, v = random_data(rng, (3, 50)), random_data(rng, (3, 50))
    d = rng.random((3, 50)) < 0.1
    a = gaescan.gae(r, v, gamma=0.9, lam=0.8, dones=d)
    assert chosen == ["auto"] and real_choose("auto", _arrays_ctx(r)) == "numba"
    assert ran == [np.dtype(np.float32)]
    b = gaescan.gae(r, v, gamma=0.9, lam=0.8, dones=d, backend="numba")
    assert chosen == ["auto", "numba"] and len(ran) == 2
    assert a.advantages.tobytes() == b.advantages.tobytes()
    ref = gt.gae(r, v, gamma=0.9, lam=0.8, dones=d)
    assert_close(a.advantages, ref.advantages, np.float32)


def _arrays_ctx(x):
    from gaescan._arrays import resolve

    return resolve({"x": x})
