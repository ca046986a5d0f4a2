"""Bad inputs raise the documented exception with a message naming the problem."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_unchanged, snapshot

import gaescan

B, T = 3, 8


def f32(*shape, fill=0.5):
    return np.full(shape, fill, np.float32)


@pytest.fixture
def rv():
    return f32(B, T), f32(B, T)


# ---------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "name, bad",
    [
        ("values", f32(B, T + 1)),
        ("values", f32(B + 1, T)),
        ("values", f32(T)),
        ("dones", np.zeros((B, T - 1), bool)),
        ("dones", np.zeros((T,), bool)),  # broadcastable but not the same shape
        ("mask", np.ones((B, 1), bool)),
        ("next_values", f32(B, T - 1)),
    ],
    ids=["values-T", "values-B", "values-1d", "dones-T", "dones-1d", "mask-col", "next_values"],
)
def test_gae_shape_mismatch(backend, rv, name, bad):
    r, v = rv
    kw = {"values": v, name: bad}
    with pytest.raises(ValueError, match="shape") as info:
        backend.gae(r, gamma=0.9, lam=0.9, **kw)
    # the message names both shapes
    msg = str(info.value)
    assert str(B) in msg and str(T) in msg and str(bad.shape[-1]) in msg, msg


def test_gae_rewards_shape_named(backend):
    with pytest.raises(ValueError, match="shape") as info:
        backend.gae(f32(2, 5), f32(2, 7), gamma=0.9, lam=0.9)
    msg = str(info.value)
    assert "5" in msg and "7" in msg, msg


def test_returns_dones_shape(backend):
    with pytest.raises(ValueError, match="shape"):
        backend.returns(f32(B, T), gamma=0.9, dones=np.zeros((B, T + 2), bool))
    with pytest.raises(ValueError, match="shape"):
        backend.returns(f32(B, T), gamma=0.9, mask=np.ones((B + 1, T), bool))


def test_scan_shapes(backend):
    with pytest.raises(ValueError, match="shape"):
        backend.scan(f32(B, T + 1), f32(B, T))
    with pytest.raises(ValueError, match="shape"):
        backend.scan(f32(B + 1, 1), f32(B, T))


def test_gamma_lam_array_not_broadcastable(backend, rv):
    r, v = rv
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=np.full((B + 1, 1), 0.9, np.float32), lam=0.9)
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=np.full((T + 1,), 0.9, np.float32))


# --------------------------------------------------------------- gamma and lam


BAD_COEFS = [1.5, -0.1, float("nan"), float("inf"), 1.0000001]


@pytest.mark.parametrize("value", BAD_COEFS, ids=str)
@pytest.mark.parametrize("which", ["gamma", "lam"])
def test_gae_coefficient_range(backend, rv, which, value):
    r, v = rv
    kw = {"gamma": 0.9, "lam": 0.9, which: value}
    with pytest.raises(ValueError, match=which):
        backend.gae(r, v, **kw)


@pytest.mark.parametrize("value", [1.5, -0.5, float("nan")], ids=str)
@pytest.mark.parametrize("which", ["gamma", "lam"])
@pytest.mark.parametrize("form", ["per-row", "per-step"])
def test_gae_array_coefficient_range(backend, rv, which, value, form):
    r, v = rv
    arr = np.full((B, 1) if form == "per-row" else (B, T), 0.9, np.float32)
    arr.flat[-1] = value
    kw = {"gamma": 0.9, "lam": 0.9, which: arr}
    with pytest.raises(ValueError, match=which):
        backend.gae(r, v, **kw)


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), np.float64(2.0)], ids=str)
def test_returns_gamma_range(backend, value):
    with pytest.raises(ValueError, match="gamma"):
        backend.returns(f32(B, T), gamma=value)
    arr = np.full((B, T), 0.9)
    arr[1, 2] = value
    with pytest.raises(ValueError, match="gamma"):
        backend.returns(f32(B, T), gamma=arr)


def test_scan_accepts_any_real_a(backend):
    # linear_scan has no range check
    y = backend.scan(-2.0, np.ones(3, np.float32))
    np.testing.assert_allclose(y, [1.0, -1.0, 3.0])


# ------------------------------------------------------------ flag exclusivity


def test_dones_with_terminated_or_truncated(backend, rv):
    r, v = rv
    d = np.zeros((B, T), bool)
    with pytest.raises(ValueError, match="dones"):
        backend.gae(r, v, gamma=0.9, lam=0.9, dones=d, terminated=d)
    with pytest.raises(ValueError, match="dones"):
        backend.gae(r, v, gamma=0.9, lam=0.9, dones=d, truncated=d, next_values=v)


def test_next_values_with_last_value(backend, rv):
    r, v = rv
    for lv in (1.0, f32(B)):
        with pytest.raises(ValueError, match="next_values|last_value"):
            backend.gae(r, v, gamma=0.9, lam=0.9, next_values=v, last_value=lv)


def test_truncated_requires_next_values(backend, rv):
    r, v = rv
    tr = np.zeros((B, T), bool)
    with pytest.raises(ValueError, match="next_values"):
        backend.gae(r, v, gamma=0.9, lam=0.9, truncated=tr)
    with pytest.raises(ValueError, match="next_values"):
        backend.gae(r, v, gamma=0.9, lam=0.9, truncated=tr, terminated=tr)
    # even with a last_value
    with pytest.raises(ValueError, match="next_values"):
        backend.gae(r, v, gamma=0.9, lam=0.9, truncated=tr, last_value=1.0)


# ------------------------------------------------------------------------- axis


@pytest.mark.parametrize("axis", [2, -3, 5])
def test_axis_out_of_range(backend, rv, axis):
    r, v = rv
    with pytest.raises(ValueError, match="axis"):
        backend.gae(r, v, gamma=0.9, lam=0.9, axis=axis)
    with pytest.raises(ValueError, match="axis"):
        backend.returns(r, gamma=0.9, axis=axis)
    with pytest.raises(ValueError, match="axis"):
        backend.scan(0.5, r, axis=axis)


@pytest.mark.parametrize("axis", [1.0, "0", None, (0,)], ids=repr)
def test_axis_not_integer(backend, rv, axis):
    r, v = rv
    with pytest.raises(TypeError, match="axis"):
        backend.gae(r, v, gamma=0.9, lam=0.9, axis=axis)
    with pytest.raises(TypeError, match="axis"):
        backend.returns(r, gamma=0.9, axis=axis)
    with pytest.raises(TypeError, match="axis"):
        backend.scan(0.5, r, axis=axis)


def test_numpy_integer_axis_is_fine(backend, rv):
    r, v = rv
    a = backend.gae(r, v, gamma=0.9, lam=0.9, axis=np.int64(0))
    b = backend.gae(r, v, gamma=0.9, lam=0.9, axis=0)
    np.testing.assert_array_equal(a.advantages, b.advantages)


# ------------------------------------------------------------------- cu_seqlens


@pytest.mark.parametrize(
    "cu",
    [[1, 4, 10], [0, 4, 9], [0, 4, 11], [0, 6, 4, 10], [-1, 4, 10], [0, 4, 10, 10, 12], [], [0]],
    ids=["not-from-0", "short-end", "long-end", "decreasing", "negative", "past-end", "empty", "only-0"],
)
def test_bad_cu_seqlens_values(backend, cu):
    n = 10
    with pytest.raises(ValueError, match="cu_seqlens"):
        backend.gae(f32(n), f32(n), gamma=0.9, lam=0.9, cu_seqlens=np.array(cu, np.int64))
    with pytest.raises(ValueError, match="cu_seqlens"):
        backend.returns(f32(n), gamma=0.9, cu_seqlens=np.array(cu, np.int64))


@pytest.mark.parametrize(
    "cu",
    [np.array([0.0, 4.0, 10.0]), np.array([0, 1], bool), np.array([[0, 4, 10]]), np.array(["0", "10"])],
    ids=["float", "bool", "2d", "str"],
)
def test_cu_seqlens_type(backend, cu):
    n = 10 if cu.dtype != bool else 1
    with pytest.raises(TypeError, match="cu_seqlens"):
        backend.gae(f32(n), f32(n), gamma=0.9, lam=0.9, cu_seqlens=cu)


def test_cu_seqlens_needs_1d_inputs(backend):
    with pytest.raises((ValueError, TypeError), match="cu_seqlens"):
        backend.gae(f32(2, 5), f32(2, 5), gamma=0.9, lam=0.9, cu_seqlens=np.array([0, 2, 5]))


def test_cu_seqlens_last_value_shape(backend):
    n = 10
    cu = np.array([0, 4, 10])
    for lv in (f32(3), f32(1), f32(2, 1)):
        with pytest.raises(ValueError, match="last_value"):
            backend.gae(f32(n), f32(n), gamma=0.9, lam=0.9, cu_seqlens=cu, last_value=lv)
    with pytest.raises(ValueError, match="last_value"):
        backend.returns(f32(n), gamma=0.9, cu_seqlens=cu, last_value=f32(n))


# ------------------------------------------------------------------ last_value


@pytest.mark.parametrize("shape", [(B + 1,), (T,), (B, 1), (1,), (B, T)], ids=str)
def test_last_value_shape(backend, rv, shape):
    r, v = rv
    with pytest.raises(ValueError, match="last_value"):
        backend.gae(r, v, gamma=0.9, lam=0.9, last_value=f32(*shape))
    with pytest.raises(ValueError, match="last_value"):
        backend.returns(r, gamma=0.9, last_value=f32(*shape))


@pytest.mark.parametrize("shape", [(B + 1,), (T,), (B, 1), (1,)], ids=str)
def test_last_advantage_shape_and_type(backend, rv, shape):
    r, v = rv
    with pytest.raises(ValueError, match="last_advantage"):
        backend.gae(r, v, gamma=0.9, lam=0.9, last_advantage=f32(*shape))
    with pytest.raises(TypeError, match="last_advantage"):
        backend.gae(r, v, gamma=0.9, lam=0.9, last_advantage="0.5")


@pytest.mark.parametrize("shape", [(B + 1,), (T,), (B, 1)], ids=str)
def test_initial_shape(backend, rv, shape):
    r, _ = rv
    with pytest.raises(ValueError, match="initial"):
        backend.scan(0.5, r, initial=f32(*shape))


# -------------------------------------------------------------------------- out


def test_gae_out_wrong_shape_or_dtype(backend, rv):
    r, v = rv
    good = f32(B, T)
    for bad in (f32(B, T + 1), np.zeros((B, T), np.float64), np.zeros((B, T), np.float16), f32(T, B)):
        with pytest.raises(ValueError):
            backend.gae(r, v, gamma=0.9, lam=0.9, out=(bad, good))
        with pytest.raises(ValueError):
            backend.gae(r, v, gamma=0.9, lam=0.9, out=(good.copy(), bad))


def test_out_overlaps_input(backend, rv):
    r, v = rv
    snap = snapshot({"r": r, "v": v})
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=0.9, out=(r, f32(B, T)))
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=0.9, out=(f32(B, T), v))
    big = f32(2 * B, T)
    with pytest.raises(ValueError):  # a view sharing memory with an input
        backend.gae(big[:B], v, gamma=0.9, lam=0.9, out=(big[B - 1 : 2 * B - 1], f32(B, T)))
    with pytest.raises(ValueError):
        backend.returns(r, gamma=0.9, out=r)
    with pytest.raises(ValueError):
        backend.returns(r, gamma=0.9, mask=np.ones((B, T), np.float32), out=r)
    with pytest.raises(ValueError):
        backend.scan(v, r, out=v)
    assert_unchanged({"r": r, "v": v}, snap)


def test_out_overlaps_flags_or_coefficients(backend, rv):
    r, v = rv
    d = np.zeros((B, T), np.float32)
    g = np.full((B, T), 0.9, np.float32)
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=0.9, dones=d, out=(d, f32(B, T)))
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=g, lam=0.9, out=(f32(B, T), g))


def test_gae_outs_overlap_each_other(backend, rv):
    r, v = rv
    o = f32(B, T)
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=0.9, out=(o, o))
    big = f32(B, T + 1)
    with pytest.raises(ValueError):
        backend.gae(r, v, gamma=0.9, lam=0.9, out=(big[:, :T], big[:, 1:]))


def test_gae_out_not_a_pair(backend, rv):
    r, v = rv
    with pytest.raises((ValueError, TypeError)):
        backend.gae(r, v, gamma=0.9, lam=0.9, out=f32(B, T))


def test_returns_and_scan_out_wrong(backend, rv):
    r, _ = rv
    with pytest.raises(ValueError):
        backend.returns(r, gamma=0.9, out=f32(B, T + 1))
    with pytest.raises(ValueError):
        backend.returns(r, gamma=0.9, out=np.zeros((B, T)))
    with pytest.raises(ValueError):
        backend.scan(0.5, r, out=np.zeros((B, T)))
    with pytest.raises(ValueError):
        backend.scan(0.5, r, out=f32(T, B))


# --------------------------------------------------------------------- backend


@pytest.mark.parametrize("name", ["cpu", "Numba", "torch", "", "dask"])
def test_unknown_backend(name):
    with pytest.raises(ValueError, match="backend") as info:
        gaescan.gae(f32(3), f32(3), gamma=0.9, lam=0.9, backend=name)
    msg = str(info.value)
    for valid in ("auto", "numba", "numpy", "cuda"):
        assert valid in msg, msg
    with pytest.raises(ValueError, match="backend"):
        gaescan.discounted_returns(f32(3), gamma=0.9, backend=name)
    with pytest.raises(ValueError, match="backend"):
        gaescan.linear_scan(0.5, f32(3), backend=name)


# --------------------------------------------------------------- array dtypes


@pytest.mark.parametrize(
    "bad",
    [np.array([1.0, 2.0], object), np.array(["a", "b"]), np.array([1 + 1j, 2.0]), np.array([b"a", b"b"])],
    ids=["object", "str", "complex", "bytes"],
)
def test_non_numeric_arrays(backend, bad):
    ok = f32(2)
    with pytest.raises(TypeError):
        backend.gae(bad, ok, gamma=0.9, lam=0.9)
    with pytest.raises(TypeError):
        backend.gae(ok, bad, gamma=0.9, lam=0.9)
    with pytest.raises(TypeError):
        backend.returns(bad, gamma=0.9)
    with pytest.raises(TypeError):
        backend.scan(bad, ok)
    with pytest.raises(TypeError):
        backend.scan(0.5, bad)


def test_complex_flags_or_coefficients(backend):
    ok = f32(2)
    with pytest.raises(TypeError):
        backend.gae(ok, ok, gamma=0.9, lam=0.9, dones=np.array([1j, 0]))
    with pytest.raises(TypeError):
        backend.gae(ok, ok, gamma=np.array([0.5 + 0j, 0.5]), lam=0.9)


# ---------------------------------------------------------------------- unclear inputs made clear


def test_out_pair_with_a_none_names_the_output(rv):
    r, v = rv
    with pytest.raises(TypeError, match=r"out\[0\] must be an array, got None"):
        gaescan.gae(r, v, gamma=0.9, lam=0.9, out=(None, np.empty_like(r)))
    with pytest.raises(TypeError, match=r"out\[1\] must be an array"):
        gaescan.gae(r, v, gamma=0.9, lam=0.9, out=(np.empty_like(r), None))


@pytest.mark.parametrize("where", ["rewards", "dones"])
def test_masked_arrays_are_refused_with_the_fix(rv, where):
    r, v = rv
    args = dict(rewards=r, values=v, dones=np.zeros((B, T), bool))
    args[where] = np.ma.masked_array(args[where], mask=np.zeros((B, T), bool))
    with pytest.raises(TypeError, match=rf"'{where}'.*masked arrays.*filled.*mask="):
        gaescan.gae(args["rewards"], args["values"], gamma=0.9, lam=0.9, dones=args["dones"])
    with pytest.raises(TypeError, match="masked arrays"):
        gaescan.linear_scan(0.5, np.ma.masked_array(r))
    with pytest.raises(TypeError, match="masked arrays"):
        gaescan.returns_summary(np.ma.masked_array(r), gamma=0.9)


def test_torch_meta_tensors_are_refused_by_device():
    torch = pytest.importorskip("torch")
    r = torch.zeros((B, T), device="meta")
    with pytest.raises(TypeError, match=r"'rewards' is a PyTorch tensor on device 'meta'.*\.to\('cpu'\)"):
        gaescan.gae(r, r, gamma=0.9, lam=0.9)
    with pytest.raises(TypeError, match="device 'meta'"):
        gaescan.discounted_returns(r, gamma=0.9)


def test_torch_tensors_requiring_grad_are_refused_with_detach():
    torch = pytest.importorskip("torch")
    r = torch.zeros((B, T))
    v = torch.zeros((B, T), requires_grad=True)
    with pytest.raises(ValueError, match=r"'values' requires grad.*values\.detach\(\)"):
        gaescan.gae(r, v, gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"'b' requires grad"):
        gaescan.linear_scan(0.5, v)
    with pytest.raises(ValueError, match="requires grad"):
        gaescan.bootstrap_summary(v)
    adv, _ = gaescan.gae(r, v.detach(), gamma=0.9, lam=0.9)  # the documented fix works
    assert not adv.requires_grad and adv.shape == (B, T)


def test_carry_in_of_different_batch_shapes_names_the_summary():
    s3 = gaescan.ScanSummary(np.ones(3), np.zeros(3))
    s4 = gaescan.ScanSummary(np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match=r"summaries\[1\]\.decay has shape \(4,\).*summaries\[0\]\.decay has shape \(3,\)"):
        gaescan.carry_in([s3, s4])
    with pytest.raises(ValueError, match=r"summaries\[0\]\.head has shape \(4,\)"):
        gaescan.carry_in([gaescan.ScanSummary(np.ones(3), np.zeros(4)), s3])


def test_bootstrap_summary_of_none_asks_for_values():
    with pytest.raises(TypeError, match="bootstrap_summary needs values"):
        gaescan.bootstrap_summary(None)
    with pytest.raises(TypeError, match="bootstrap_summary needs values"):
        gaescan.bootstrap_summary(None, mask=np.ones((B, T), bool))


@pytest.mark.parametrize("bad", ["yes", 1, None, np.array([True, False])])
def test_one_reverse_check_everywhere(rv, bad):
    r, _ = rv
    for call in (lambda: gaescan.linear_scan(0.5, r, reverse=bad),
                 lambda: gaescan.scan_summary(0.5, r, reverse=bad),
                 lambda: gaescan.carry_in([gaescan.ScanSummary(np.ones(3), np.zeros(3))], reverse=bad)):
        with pytest.raises(TypeError, match="reverse must be a bool"):
            call()
    for good in (True, np.bool_(True), np.array(True)):
        np.testing.assert_array_equal(gaescan.linear_scan(0.5, r, reverse=good),
                                      gaescan.linear_scan(0.5, r, reverse=True))


def test_value_checks_run_on_every_call_of_a_known_structure(rv):
    # A second call of the same structure starts from the kept plan; the checks
    # of values (γ, λ in [0, 1], array coefficients, cu_seqlens offsets) still run.
    r, v = rv
    gaescan.gae(r, v, gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"'gamma' must lie in \[0, 1\], got 1.5"):
        gaescan.gae(r, v, gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0, 1\]"):
        gaescan.gae(r, v, gamma=0.9, lam=float("nan"))
    g = np.full((B, 1), 0.9, np.float32)
    gaescan.discounted_returns(r, gamma=g)
    with pytest.raises(ValueError, match="every element of 'gamma'"):
        gaescan.discounted_returns(r, gamma=np.full((B, 1), -0.1, np.float32))
    x = f32(6)
    gaescan.discounted_returns(x, gamma=0.9, cu_seqlens=np.array([0, 2, 6]))
    with pytest.raises(ValueError, match="non-decreasing"):
        gaescan.discounted_returns(x, gamma=0.9, cu_seqlens=np.array([0, 4, 2, 6]))
    # The same shapes in float64 make a float64 result (dtypes are part of the structure).
    assert gaescan.gae(r.astype(np.float64), v, gamma=0.9, lam=0.9).advantages.dtype == np.float64
