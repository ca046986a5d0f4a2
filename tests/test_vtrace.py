"""gaescan.vtrace against the float64 reference gaescan.testing.vtrace, on the CPU backends:
lengths, flags, masks, packing, coefficient forms, axes, dtypes, clipping, NaN
isolation, the on-policy identity with GAE, torch tensors, out= and errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import (
    FLAG_MODES,
    aligned_rows_out,
    assert_close,
    assert_unchanged,
    assert_zero_where,
    flag_kwargs,
    one_thread_and_all,
    random_cu_seqlens,
    random_data,
    random_flags,
    snapshot,
)

import gaescan
import gaescan.testing as gt

VT_LENGTHS = [1, 2, 3, 5, 7, 13, 31, 32, 33, 61, 127, 128, 129, 257, 1000]


def log_ratios(rng, shape, scale=0.7, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def check_vtrace(backend, dtype=None, **kw):
    """Run vtrace on ``backend`` (a conftest ``Backend``) and compare both outputs with the reference."""
    snap = snapshot(kw)
    res = gaescan.vtrace(**kw, backend=backend.name)
    assert isinstance(res, gaescan.VTraceResult)
    ref = gt.vtrace(**kw)
    if dtype is None:
        dtype = gt.result_dtype(kw["rewards"], kw["values"], kw["log_rhos"], kw.get("next_values"),
                                kw.get("last_value"), kw.get("last_trace"), kw["gamma"], kw.get("lam", 1.0))
    assert_close(res.vs, ref.vs, dtype)
    assert_close(res.advantages, ref.advantages, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(res.vs, kw["mask"])
        assert_zero_where(res.advantages, kw["mask"])
    return res


def _case(rng, shape, mode, dtype=np.float32):
    r = random_data(rng, shape, dtype)
    v = random_data(rng, shape, dtype)
    kw = dict(rewards=r, values=v, log_rhos=log_ratios(rng, shape, dtype=dtype))
    kw.update(flag_kwargs(mode, rng, shape, v))
    if "next_values" not in kw:
        kw["last_value"] = random_data(rng, shape[:-1], dtype)
    return kw


@pytest.mark.parametrize("mode", FLAG_MODES)
def test_lengths_and_flags(backend, rng, mode):
    for T in VT_LENGTHS:
        check_vtrace(backend, **_case(rng, (3, T), mode), gamma=0.99, lam=0.95, c_bar=0.9)


@pytest.mark.parametrize("mode", FLAG_MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masks_and_dtypes(backend, rng, mode, dtype):
    for T in (1, 2, 31, 33, 128, 129, 1000):
        kw = _case(rng, (4, T), mode, dtype)
        kw["mask"] = random_flags(rng, (4, T), 0.7)
        check_vtrace(backend, **kw, gamma=0.97, lam=0.9, rho_bar=1.5, c_bar=1.0)


@pytest.mark.parametrize("gamma_form", ["scalar", "row", "step"])
@pytest.mark.parametrize("lam_form", ["scalar", "row", "step"])
def test_gamma_lam_forms(backend, rng, gamma_form, lam_form):
    shape = (5, 129)
    forms = {
        "scalar": lambda lo: float(rng.uniform(lo, 1.0)),
        "row": lambda lo: rng.uniform(lo, 1.0, size=(5, 1)).astype(np.float32),
        "step": lambda lo: rng.uniform(lo, 1.0, size=shape).astype(np.float32),
    }
    kw = _case(rng, shape, "dones")
    check_vtrace(backend, **kw, gamma=forms[gamma_form](0.8), lam=forms[lam_form](0.5))


@pytest.mark.parametrize("rho_bar", [0.5, 1.0, 2.0, np.inf])
@pytest.mark.parametrize("c_bar", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("pg_rho_bar", [None, 0.5, 3.0])
def test_clipping(backend, rng, rho_bar, c_bar, pg_rho_bar):
    kw = _case(rng, (3, 200), "term+trunc")
    kw["log_rhos"] = log_ratios(rng, (3, 200), scale=2.0)
    check_vtrace(backend, **kw, gamma=0.99, lam=1.0, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)


def test_clipping_changes_results(rng):
    """The thresholds are read: tighter clipping of large ratios changes vs and the advantages."""
    kw = _case(rng, (2, 50), "dones")
    kw["log_rhos"] = np.full((2, 50), 1.0, np.float32)
    a = gaescan.vtrace(**kw, gamma=0.99, rho_bar=1.0, c_bar=1.0)
    b = gaescan.vtrace(**kw, gamma=0.99, rho_bar=2.0, c_bar=2.0, pg_rho_bar=1.0)
    assert not np.allclose(a.vs, b.vs)
    c = gaescan.vtrace(**kw, gamma=0.99, rho_bar=1.0, c_bar=1.0, pg_rho_bar=2.0)
    np.testing.assert_array_equal(a.vs, c.vs)
    assert not np.allclose(a.advantages, c.advantages)


@pytest.mark.parametrize("extra", ["plain", "mask", "next_values"])
def test_cu_seqlens(backend, rng, extra):
    for N, S in [(1, 1), (33, 3), (129, 7), (1000, 13), (0, 2)]:
        cu = random_cu_seqlens(rng, N, S)
        kw = dict(rewards=random_data(rng, (N,)), values=random_data(rng, (N,)), log_rhos=log_ratios(rng, (N,)),
                  dones=random_flags(rng, (N,), 0.05), cu_seqlens=cu)
        if extra == "next_values":
            kw.pop("dones")
            kw.update(terminated=random_flags(rng, (N,), 0.05), truncated=random_flags(rng, (N,), 0.05),
                      next_values=random_data(rng, (N,)))
        else:
            kw["last_value"] = random_data(rng, (S,))
        if extra == "mask":
            kw["mask"] = random_flags(rng, (N,), 0.75)
        check_vtrace(backend, **kw, gamma=0.98, lam=0.9)


def test_cu_seqlens_equals_separate_rows(backend, rng):
    cu = np.array([0, 5, 5, 40, 41, 100])
    N = 100
    r, v, lr = random_data(rng, (N,)), random_data(rng, (N,)), log_ratios(rng, (N,))
    d, lv = random_flags(rng, (N,), 0.1), random_data(rng, (5,))
    packed = gaescan.vtrace(r, v, lr, gamma=0.9, lam=0.8, dones=d, last_value=lv, cu_seqlens=cu,
                            backend=backend.name)
    for s in range(5):
        lo, hi = cu[s], cu[s + 1]
        one = gaescan.vtrace(r[lo:hi], v[lo:hi], lr[lo:hi], gamma=0.9, lam=0.8, dones=d[lo:hi],
                             last_value=float(lv[s]), backend=backend.name)
        np.testing.assert_allclose(packed.vs[lo:hi], one.vs, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(packed.advantages[lo:hi], one.advantages, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["dones", "term+trunc"])
def test_time_major_and_3d(backend, rng, mode):
    # time-major [T, B], axis=0
    kw = _case(rng, (7, 129), mode)
    kw = {k: (np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
          for k, x in kw.items()}
    res = check_vtrace(backend, **kw, gamma=0.99, lam=0.9, axis=0)
    # the same as the batch-major call on the transposes
    bm = {k: (x.T if isinstance(x, np.ndarray) and x.ndim == 2 else x) for k, x in kw.items()}
    want = gaescan.vtrace(**bm, gamma=0.99, lam=0.9, backend=backend.name)
    np.testing.assert_allclose(res.vs, want.vs.T, rtol=1e-6, atol=1e-6)
    # 3-D, time in the middle, non-contiguous
    shape = (3, 65, 4)
    kw3 = dict(rewards=random_data(rng, shape), values=random_data(rng, (3, 4, 65)).transpose(0, 2, 1),
               log_rhos=log_ratios(rng, shape), dones=random_flags(rng, shape, 0.1),
               last_value=random_data(rng, (3, 4)))
    check_vtrace(backend, **kw3, gamma=0.95, lam=0.9, axis=1)


@pytest.mark.parametrize("rows", [1, 3, 4])
@pytest.mark.parametrize("extra", ["dones", "term+trunc", "mask", "per-step"])
def test_long_rows(backend, rng, rows, extra):
    """Rows long and many enough for the parallel (not the calling-thread) kernel builds,
    odd row counts (a row without a partner), on the fused and the general kernels."""
    shape = (rows, 3 * (1 << 14) + 5)
    kw = _case(rng, shape, "dones" if extra in ("mask", "per-step") else extra)
    gamma = 0.999
    if extra == "mask":
        kw["mask"] = random_flags(rng, shape, 0.8)
    if extra == "per-step":
        gamma = rng.uniform(0.99, 1.0, size=shape).astype(np.float32)
    check_vtrace(backend, **kw, gamma=gamma, lam=0.97, c_bar=1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decay_near_one(backend, rng, dtype):
    """γ just below 1 with λ = 1 and constant rewards: a float32 state would drift."""
    T = 1 << 16
    r = np.ones((2, T), dtype)
    v = random_data(rng, (2, T), dtype)
    lr = np.zeros((2, T), dtype)
    check_vtrace(backend, rewards=r, values=v, log_rhos=lr, gamma=float(np.float32(0.9999999)), lam=1.0,
                 rho_bar=1.0, c_bar=1.0)


@pytest.mark.parametrize("mode", ["none", "dones", "term+trunc", "trunc-only"])
@pytest.mark.parametrize("B", [5, 300])
def test_time_major_buffers(backend, rng, mode, B):
    """[T, B] buffers (SB3/CleanRL layout) with per-column γ, across blocks of batch columns
    and above the calling-thread size."""
    T = 257
    kw = _case(rng, (B, T), mode)
    kw = {k: (np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
          for k, x in kw.items()}
    gamma = rng.uniform(0.9, 1.0, size=(1, B)).astype(np.float32)
    check_vtrace(backend, **kw, gamma=gamma, lam=0.9, rho_bar=1.2, c_bar=0.8, axis=0)


@pytest.mark.parametrize("layout", ["rows", "time-major", "mask", "per-step", "packed"])
@pytest.mark.parametrize("form", ["scalar", "array"])
def test_last_trace(backend, rng, layout, form):
    """``last_trace`` (D past each row's or segment's end) on every kernel path."""
    B, T = 6, 300
    kw = _case(rng, (B, T), "dones")
    lt = -1.5 if form == "scalar" else random_data(rng, (B,), np.float32, scale=2.0)
    gamma = 0.95
    if layout == "time-major":
        kw = {k: (np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
              for k, x in kw.items()}
        check_vtrace(backend, **kw, gamma=gamma, lam=0.9, axis=0, last_trace=lt)
        return
    if layout == "mask":
        kw["mask"] = random_flags(rng, (B, T), 0.8)
        kw["mask"][:, -5:] = False
    if layout == "per-step":
        gamma = rng.uniform(0.9, 1.0, (B, T)).astype(np.float32)
    if layout == "packed":
        n = B * T
        kw = {k: x.reshape(n) for k, x in kw.items() if k != "last_value"}
        cu = random_cu_seqlens(rng, n, 9)
        kw.update(cu_seqlens=cu, last_value=random_data(rng, (9,)))
        lt = lt if form == "scalar" else random_data(rng, (9,), np.float32, scale=2.0)
    check_vtrace(backend, **kw, gamma=gamma, lam=0.9, c_bar=1.3, last_trace=lt)


# ------------------------------------------------------------------ on-policy identity


@pytest.mark.parametrize("mode", FLAG_MODES + ["mask"])
@pytest.mark.parametrize("bars", [(1.0, 1.0), (2.0, 1.0), (np.inf, 5.0)])
def test_on_policy_vs_equals_gae_returns(backend, rng, mode, bars):
    """The contract's identity: log_rhos = 0, rho_bar, c_bar >= 1 gives vs = gae(...).returns."""
    rho_bar, c_bar = bars
    for T in (1, 33, 129, 1000):
        kw = _case(rng, (3, T), "dones" if mode == "mask" else mode)
        kw["log_rhos"] = np.zeros((3, T), np.float32)
        if mode == "mask":
            kw["mask"] = random_flags(rng, (3, T), 0.7)
        for lam in (0.0, 0.9, 1.0):
            res = gaescan.vtrace(**kw, gamma=0.99, lam=lam, rho_bar=rho_bar, c_bar=c_bar, backend=backend.name)
            g = {k: x for k, x in kw.items() if k != "log_rhos"}
            want = gaescan.gae(**g, gamma=0.99, lam=lam, backend=backend.name).returns
            gt.assert_close(res.vs, want, dtype=np.float32)


# ------------------------------------------------------------------ NaN and inf isolation


@pytest.mark.parametrize("field", ["rewards", "values", "log_rhos"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("mode", ["dones", "term+trunc"])
def test_nan_stays_in_its_episode(backend, rng, field, bad, mode):
    T, end = 300, 137
    kw = _case(rng, (2, T), "none")
    kw.pop("last_value")
    if mode == "dones":
        d = np.zeros((2, T), bool)
        d[:, end] = True
        kw["dones"] = d
    else:
        tr = np.zeros((2, T), bool)
        tr[0, end] = True
        te = np.zeros((2, T), bool)
        te[1, end] = True
        kw.update(terminated=te, truncated=tr, next_values=random_data(rng, (2, T)))
    kw[field][:, end + 1 + 50] = bad  # in the second episode
    res = check_vtrace(backend, **kw, gamma=0.99, lam=0.95)
    assert np.isfinite(res.vs[:, : end + 1]).all()
    assert np.isfinite(res.advantages[:, : end + 1]).all()
    if field != "log_rhos" or bad != np.inf:  # an infinite ratio is clipped to rho_bar
        assert not np.isfinite(res.vs[:, end + 1: end + 52]).all()


def test_masked_positions_are_never_read(backend, rng):
    shape = (3, 200)
    kw = _case(rng, shape, "dones")
    m = random_flags(rng, shape, 0.7)
    kw["mask"] = m
    clean = gaescan.vtrace(**kw, gamma=0.99, lam=0.9, backend=backend.name)
    dirty = {k: (x.copy() if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    for f in ("rewards", "values", "log_rhos"):
        dirty[f][~m] = np.nan
    got = gaescan.vtrace(**dirty, gamma=0.99, lam=0.9, backend=backend.name)
    np.testing.assert_array_equal(got.vs, clean.vs)
    np.testing.assert_array_equal(got.advantages, clean.advantages)


# ------------------------------------------------------------------ types, out=, edge cases


def test_dtype_rules(backend, rng):
    r = np.arange(10, dtype=np.int32).reshape(2, 5)
    v = np.zeros((2, 5), np.float16)
    lr = np.zeros((2, 5), bool)
    res = check_vtrace(backend, rewards=r, values=v, log_rhos=lr, gamma=0.9, dtype=np.float32)
    assert res.vs.dtype == np.float32
    res = check_vtrace(backend, rewards=r.astype(np.float32), values=v.astype(np.float32),
                       log_rhos=np.zeros((2, 5)), gamma=0.9)
    assert res.vs.dtype == np.float64


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
def test_zero_size(backend, shape):
    z = np.zeros(shape, np.float32)
    res = gaescan.vtrace(z, z, z, gamma=0.9, backend=backend.name)
    assert res.vs.shape == shape and res.advantages.shape == shape and res.vs.dtype == np.float32


def test_out(backend, rng):
    kw = _case(rng, (3, 70), "dones")
    out = (np.full((3, 70), np.nan, np.float32), np.full((3, 70), np.nan, np.float32))
    res = gaescan.vtrace(**kw, gamma=0.99, lam=0.9, out=out, backend=backend.name)
    assert res.vs is out[0] and res.advantages is out[1]
    ref = gt.vtrace(**kw, gamma=0.99, lam=0.9)
    assert_close(out[0], ref.vs, np.float32)
    assert_close(out[1], ref.advantages, np.float32)
    # non-contiguous out, time-major
    big = np.full((70, 6), np.nan, np.float32), np.full((70, 6), np.nan, np.float32)
    views = (big[0][:, ::2], big[1][:, ::2])
    tm = {k: (np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
          for k, x in kw.items()}
    gaescan.vtrace(**tm, gamma=0.99, lam=0.9, axis=0, out=views, backend=backend.name)
    assert_close(views[0], ref.vs.T, np.float32)
    assert np.isnan(big[0][:, 1::2]).all()


def test_out_errors(rng):
    kw = _case(rng, (2, 10), "dones")
    with pytest.raises(ValueError, match="dtype"):
        gaescan.vtrace(**kw, gamma=0.9, out=(np.empty((2, 10)), np.empty((2, 10))))
    with pytest.raises(ValueError, match="overlaps the input 'log_rhos'"):
        gaescan.vtrace(**kw, gamma=0.9, out=(kw["log_rhos"], np.empty((2, 10), np.float32)))
    with pytest.raises(ValueError, match="sequence of 2"):
        gaescan.vtrace(**kw, gamma=0.9, out=np.empty((2, 10), np.float32))


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    kw = _case(rng, (3, 129), "term+trunc")
    tkw = {k: (torch.from_numpy(x) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    for b in ("numba", "numpy"):
        res = gaescan.vtrace(**tkw, gamma=0.99, lam=0.9, backend=b)
        assert isinstance(res.vs, torch.Tensor) and res.vs.dtype == torch.float32
        assert isinstance(res.advantages, torch.Tensor)
        ref = gt.vtrace(**kw, gamma=0.99, lam=0.9)
        assert_close(res.vs.numpy(), ref.vs, np.float32)
        assert_close(res.advantages.numpy(), ref.advantages, np.float32)
    out = (torch.empty(3, 129), torch.empty(3, 129))
    res = gaescan.vtrace(**tkw, gamma=0.99, lam=0.9, out=out)
    assert res.vs is out[0]
    assert_close(out[1].numpy(), ref.advantages, np.float32)
    with pytest.raises(TypeError, match="(?i)torch"):
        gaescan.vtrace(tkw["rewards"], kw["values"], kw["log_rhos"], gamma=0.9)


def test_deterministic(backend, rng):
    kw = _case(rng, (4, 300), "dones")
    a = gaescan.vtrace(**kw, gamma=0.99, lam=0.9, backend=backend.name)
    b = gaescan.vtrace(**kw, gamma=0.99, lam=0.9, backend=backend.name)
    np.testing.assert_array_equal(a.vs, b.vs)
    np.testing.assert_array_equal(a.advantages, b.advantages)


def test_auto_is_numba(rng):
    kw = _case(rng, (2, 40), "dones")
    a = gaescan.vtrace(**kw, gamma=0.99)
    b = gaescan.vtrace(**kw, gamma=0.99, backend="numba")
    np.testing.assert_array_equal(a.vs, b.vs)


# ------------------------------------------------------------------ errors


def _base(rng, shape=(2, 10)):
    return dict(rewards=random_data(rng, shape), values=random_data(rng, shape), log_rhos=log_ratios(rng, shape))


def test_shape_mismatch(rng):
    kw = _base(rng)
    kw["log_rhos"] = kw["log_rhos"][:, :9]
    with pytest.raises(ValueError, match="'log_rhos' has shape"):
        gaescan.vtrace(**kw, gamma=0.9)
    kw = _base(rng)
    with pytest.raises(ValueError, match="'dones' has shape"):
        gaescan.vtrace(**kw, gamma=0.9, dones=np.zeros((2, 11), bool))
    with pytest.raises(ValueError, match="last_value"):
        gaescan.vtrace(**kw, gamma=0.9, last_value=np.zeros(3))


@pytest.mark.parametrize("name", ["rho_bar", "c_bar", "pg_rho_bar"])
@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan])
def test_thresholds_must_be_positive(rng, name, bad):
    with pytest.raises(ValueError, match=name):
        gaescan.vtrace(**_base(rng), gamma=0.9, **{name: bad})


def test_threshold_must_be_scalar(rng):
    with pytest.raises(TypeError, match="rho_bar"):
        gaescan.vtrace(**_base(rng), gamma=0.9, rho_bar=np.ones((2, 10)))
    with pytest.raises(TypeError, match="c_bar"):
        gaescan.vtrace(**_base(rng), gamma=0.9, c_bar="1")


@pytest.mark.parametrize("name", ["gamma", "lam"])
def test_coefficients_in_unit_range(rng, name):
    kw = dict(gamma=0.9, lam=0.9)
    kw[name] = 1.5
    with pytest.raises(ValueError, match=name):
        gaescan.vtrace(**_base(rng), **kw)
    kw[name] = np.full((2, 1), -0.1, np.float32)
    with pytest.raises(ValueError, match=name):
        gaescan.vtrace(**_base(rng), **kw)


def test_episode_end_rules(rng):
    kw = _base(rng)
    f = np.zeros((2, 10), bool)
    with pytest.raises(ValueError, match="truncated needs next_values"):
        gaescan.vtrace(**kw, gamma=0.9, truncated=f)
    with pytest.raises(ValueError, match="dones or terminated"):
        gaescan.vtrace(**kw, gamma=0.9, dones=f, terminated=f)
    with pytest.raises(ValueError, match="exclusive"):
        gaescan.vtrace(**kw, gamma=0.9, next_values=kw["values"], last_value=0.0)


def test_backend_names(rng):
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):  # the simulator runs "cuda" on host arrays
        with pytest.raises(TypeError, match=r"backend='cuda' needs GPU arrays.*backend='numba'"):
            gaescan.vtrace(**_base(rng), gamma=0.9, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend"):
        gaescan.vtrace(**_base(rng), gamma=0.9, backend="jax")


def test_cu_seqlens_errors(rng):
    kw = _base(rng, (10,))
    with pytest.raises(ValueError, match="cu_seqlens must end"):
        gaescan.vtrace(**kw, gamma=0.9, cu_seqlens=np.array([0, 4, 9]))
    with pytest.raises(TypeError, match="cu_seqlens"):
        gaescan.vtrace(**kw, gamma=0.9, cu_seqlens=np.array([0.0, 10.0]))


# --------------------------------------------------------------------------- eight rows in SIMD lanes
# vtrace_lanes (float32 batch-major rows, plain or with terminations, no next_values,
# above SERIAL_MAX_STEPS) runs rows 8 at a time and the last R % 8 rows through the
# tiled fused kernel.  Each case runs once through it (SERIAL_MAX_STEPS = 0) and once
# with the lanes kernel refused.  Its blocks compute the exponential, the bracket and
# the advantage in float32, so they differ from the fused kernel's float64 terms by
# float32 roundings (a block with a log-ratio outside [-87, 88] takes the fused
# kernel's terms and bits); the last R % 8 rows and each row's last T % 16 steps (run
# one row at a time before the blocks) give the fused kernel's bits.

VT_LANE_ROWS = [8, 9, 15, 16, 17, 24]
VT_LANE_LENGTHS = [1, 7, 8, 15, 16, 17, 32, 33, 61, 131, 2053]  # around the 16-step block, and primes


def _vt_lanes_and_fused(monkeypatch, **kw):
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    got = gaescan.vtrace(**kw, backend="numba")
    with monkeypatch.context() as m:
        m.setattr(vtrace_numba, "_lanes_ok", lambda *a, **k: False)
        m.setattr(vtrace_numba, "_lanes_next_ok", lambda *a: False)
        fused = gaescan.vtrace(**kw, backend="numba")
    return got, fused


def _vt_same_bits(a, b):
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b, strict=True))


def _vt_near_fused(got, fused, R, T, h0=0):
    """The lanes result against the fused kernel's: the same bits where both run the
    same operations on the same carry (the last R % 8 rows, and each row's steps
    after the last 16-step block from step ``h0``), within 1e-6 relative L2 (the
    blocks' exponential) elsewhere."""
    tail, r8 = (T - h0) % 16, R - R % 8
    for x, y in zip(got, fused, strict=True):
        assert np.array_equal(x[r8:].view(np.uint32), y[r8:].view(np.uint32))
        assert np.array_equal(x[:, T - tail:].view(np.uint32), y[:, T - tail:].view(np.uint32))
        assert np.array_equal(np.isfinite(x), np.isfinite(y))
        ok = np.isfinite(y)
        assert np.linalg.norm((x - y)[ok].astype(np.float64)) <= 1e-6 * np.linalg.norm(y[ok].astype(np.float64))


def _kernel_calls(monkeypatch):
    """The names of the CPU kernels called from now on, in order."""
    from gaescan.kernels import cpu

    calls = []
    real_call = cpu.Kernel.__call__

    def spy(self, *args):
        calls.append(self.__name__)
        return real_call(self, *args)

    monkeypatch.setattr(cpu.Kernel, "__call__", spy)
    return calls


def _check_lanes_case(monkeypatch, calls, case, lanes_kernel, R, T):
    """One case through the lanes kernel and through the fused kernel: the calls
    made, the two results against each other and against the reference."""
    calls.clear()
    got, fused = _vt_lanes_and_fused(monkeypatch, **case)
    # the lanes run (its last R % 8 rows through the fused kernel), then the fused run
    assert calls == [lanes_kernel] + (["vtrace_fused"] if R % 8 else []) + ["vtrace_fused"]
    _vt_near_fused(got, fused, R, T)
    ref = gt.vtrace(**case)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)


@pytest.mark.parametrize("T", VT_LANE_LENGTHS)
@pytest.mark.parametrize("R", VT_LANE_ROWS)
def test_lanes_kernel_matches_the_fused_kernel(monkeypatch, R, T):

    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(R * 1000 + T)
    r, v = random_data(rng, (R, T), np.float32), random_data(rng, (R, T), np.float32)
    kw = dict(rewards=r, values=v, log_rhos=log_ratios(rng, (R, T)), gamma=0.99,
              last_value=random_data(rng, (R,), np.float32), last_trace=random_data(rng, (R,), np.float32))
    for extra in (dict(dones=rng.random((R, T)) < 0.05), {},
                  dict(dones=rng.random((R, T)) < 0.05, lam=0.9, rho_bar=1.5, c_bar=0.8, pg_rho_bar=0.7,
                       gamma=rng.uniform(0.9, 1.0, (R, 1)).astype(np.float32))):
        _check_lanes_case(monkeypatch, calls, {**kw, **extra}, "vtrace_lanes", R, T)


def test_lanes_kernel_nan_stays_in_its_episode(monkeypatch):
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(5)
    R, T, cut = 16, 16 * 20 + 5, 150
    r, v = random_data(rng, (R, T), np.float32), random_data(rng, (R, T), np.float32)
    lr = log_ratios(rng, (R, T))
    d = np.zeros((R, T), bool)
    d[:, cut] = True
    r[:, cut + 1:cut + 20] = np.nan
    v[3, cut + 30] = np.inf
    lr[5, cut + 40] = np.nan
    res = gaescan.vtrace(r, v, lr, gamma=0.99, dones=d, backend="numba")
    assert np.all(np.isfinite(res.vs[:, :cut + 1])) and np.all(np.isfinite(res.advantages[:, :cut + 1]))
    ref = gt.vtrace(r[:, :cut + 1], v[:, :cut + 1], lr[:, :cut + 1], gamma=0.99, dones=d[:, :cut + 1])
    assert_close(res.vs[:, :cut + 1], ref.vs, np.float32)
    assert_close(res.advantages[:, :cut + 1], ref.advantages, np.float32)


def test_lanes_kernel_is_thread_count_independent(monkeypatch):
    import numba

    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(9)
    r, v = random_data(rng, (40, 1003), np.float32), random_data(rng, (40, 1003), np.float32)
    kw = dict(log_rhos=log_ratios(rng, (40, 1003)), gamma=0.999, lam=0.99, dones=rng.random((40, 1003)) < 0.01)
    a1 = gaescan.vtrace(r, v, **kw, backend="numba")
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a2 = gaescan.vtrace(r, v, **kw, backend="numba")
    finally:
        numba.set_num_threads(n)
    assert _vt_same_bits(a1, a2)


def test_lanes_kernel_exponential_is_within_one_float32_ulp(monkeypatch):
    # γ = 0 and r = 1, v = 0: the advantage is min(ρ̄pg, e^lr) rounded to float32,
    # over log-ratios across the blocks' range and beyond it.
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    R, T = 8, 16 * 2500
    lr = np.linspace(-87.0, 68.0, R * T, dtype=np.float32).reshape(R, T)
    ones, zeros = np.ones((R, T), np.float32), np.zeros((R, T), np.float32)
    got = gaescan.vtrace(ones, zeros, lr, gamma=0.0, pg_rho_bar=1e30, backend="numba").advantages
    want = np.exp(lr.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    assert np.mean(ulps == 0) >= 0.8


def test_lanes_kernel_wide_log_ratios_take_the_float64_exponential(monkeypatch):
    # One log-ratio outside [-87, 88] (±95, ±inf) in every 16-step block of every
    # group of 8 rows: every block takes the fused kernel's exponential and its bits.
    R, T = 17, 16 * 40 + 5
    rng = np.random.default_rng(23)
    lr = log_ratios(rng, (R, T))
    lr[::8, 0:T - T % 16:16] = np.resize(np.array([95.0, -95.0, np.inf, -np.inf], np.float32),
                                         lr[::8, 0:T - T % 16:16].shape)
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=lr, gamma=0.99, dones=rng.random((R, T)) < 0.02)
    got, fused = _vt_lanes_and_fused(monkeypatch, **kw)
    assert _vt_same_bits(got, fused)


# C-contiguous outputs of numba_cpu.STREAM_MIN_BYTES and up whose rows start their
# 64-byte lines at one step ``phase``: the lanes kernels start their blocks there and
# write them by non-temporal stores.  The steps after the last block and before ``phase``
# run one row at a time with the fused kernel's operations.


@pytest.mark.parametrize("case", ["plain", "dones", "next"])
@pytest.mark.parametrize("R,T,offset", [(8, 16, 3), (8, 48, 0), (17, 48, 5), (9, 160, 7), (16, 64, 15),
                                        (24, 2048, 11), (17, 131, 5)])
def test_lanes_kernel_streams_from_the_outputs_phase(monkeypatch, case, R, T, offset):
    from gaescan.backends import numba_cpu, vtrace_numba
    from gaescan.kernels import cpu

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(R * 100 + T + offset)
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), gamma=0.99, last_trace=random_data(rng, (R,), np.float32))
    if case == "dones":
        kw.update(dones=rng.random((R, T)) < 0.05, last_value=random_data(rng, (R,), np.float32))
    elif case == "next":
        kw.update(next_values=random_data(rng, (R, T), np.float32), terminated=rng.random((R, T)) < 0.05,
                  truncated=rng.random((R, T)) < 0.05)
    name = "vtrace_lanes_next" if case == "next" else "vtrace_lanes"
    args, ordinary = [], []
    real_call = cpu.Kernel.__call__

    def spy(self, *a):
        if self.__name__ == name:
            args.append(a[-4:-2])
            if ordinary:  # the same phase with ordinary stores
                a = a[:-3] + (False,) + a[-2:]
        return real_call(self, *a)

    monkeypatch.setattr(cpu.Kernel, "__call__", spy)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)

    def run():
        return gaescan.vtrace(**kw, backend="numba", out=tuple(aligned_rows_out(R, T, T, offset)))

    # Rows a multiple of 64 bytes apart stream; others take the end-anchored blocks.
    phase = (16 - offset) % 16 if T % 16 == 0 else 0
    h0 = phase if phase + 16 <= T else 0
    got, one = one_thread_and_all(run)
    assert args == [(phase, T % 16 == 0)] * 2
    ordinary.append(True)
    assert _vt_same_bits(got, one) and _vt_same_bits(got, run())
    with monkeypatch.context() as m:
        m.setattr(vtrace_numba, "_lanes_ok", lambda *a, **k: False)
        m.setattr(vtrace_numba, "_lanes_next_ok", lambda *a: False)
        fused = gaescan.vtrace(**kw, backend="numba")
    _vt_near_fused(got, fused, R, T, h0)
    ref = gt.vtrace(**kw)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)


def _placed(x, offset):
    """A copy of ``x`` whose data starts ``offset`` bytes past a 64-byte line."""
    buf = np.empty(x.nbytes + 64, np.uint8)
    skip = (offset - buf.__array_interface__["data"][0]) % 64
    y = buf[skip:skip + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


def test_lanes_kernel_bits_do_not_depend_on_where_the_inputs_lie(monkeypatch):
    # The blocks start where the outputs' lines start; outputs this call allocates
    # start 16 bytes past a line, wherever the inputs lie: the same bits every call.
    from gaescan import _validate
    from gaescan.backends import numba_cpu, vtrace_numba
    from gaescan.kernels import cpu

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(_validate, "PLACED_MIN_BYTES", 0)
    streams = []
    real_call = cpu.Kernel.__call__
    monkeypatch.setattr(cpu.Kernel, "__call__",
                        lambda self, *a: (streams.append(a[-4:-2]) if self.__name__ == "vtrace_lanes" else None,
                                          real_call(self, *a))[1])
    rng = np.random.default_rng(12)
    R, T = 24, 2048
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), dones=rng.random((R, T)) < 0.01)
    results = []
    for offset in (0, 4, 16, 28, 48):
        res = gaescan.vtrace(**{k: _placed(x, offset) for k, x in kw.items()}, gamma=0.99, backend="numba")
        assert all(x.ctypes.data % 64 == 16 for x in res)
        results.append(res)
    assert streams == [(12, True)] * 5
    assert all(_vt_same_bits(results[0], x) for x in results[1:])
    ref = gt.vtrace(**kw, gamma=0.99)
    assert_close(results[0].vs, ref.vs, np.float32)
    assert_close(results[0].advantages, ref.advantages, np.float32)


# The lanes kernels carry the trace in float32 where GAE's kernels would carry
# theirs (γλc̄ at most F32_STATE_MAX_DECAY) and ρ̄ <= 1; elsewhere in float64, which
# the limit forced below every decay gives everywhere.
@pytest.mark.parametrize("extra, state32", [
    ({}, True),  # γ = 0.99, λ = c̄ = ρ̄ = 1: the decay at the limit
    (dict(lam=0.95, c_bar=1.04), True),  # γλc̄ = 0.978
    (dict(gamma="rows"), True),  # per-row γ in [0.9, 0.99]
    (dict(gamma=0.995), False),  # γλc̄ above the limit
    (dict(c_bar=np.inf), False),  # no bound on the decay
    (dict(rho_bar=1.5), False),  # δ may exceed the bracket
], ids=["limit", "below", "per_row", "above", "c_bar_inf", "rho_bar"])
def test_lanes_kernel_trace_width(monkeypatch, extra, state32):
    from gaescan.backends import numba_cpu, vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    chosen = []
    real = vtrace_numba._state32
    monkeypatch.setattr(vtrace_numba, "_state32", lambda *a: chosen.append(real(*a)) or chosen[-1])
    R, T = 17, 16 * 40 + 5
    rng = np.random.default_rng(31)
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), dones=rng.random((R, T)) < 0.02)
    kw.update({"gamma": 0.99, **extra})
    if isinstance(kw["gamma"], str):
        kw["gamma"] = rng.uniform(0.9, 0.99, (R, 1)).astype(np.float32)
    got = gaescan.vtrace(**kw, backend="numba")
    assert chosen == [state32]
    monkeypatch.setattr(numba_cpu, "F32_STATE_MAX_DECAY", -1.0)
    wide = gaescan.vtrace(**kw, backend="numba")
    assert chosen == [state32, False]
    if state32:
        assert not _vt_same_bits(got, wide)
        _vt_near_fused(got, wide, R, T)
    else:
        assert _vt_same_bits(got, wide)
    ref = gt.vtrace(**kw)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.99, float(np.float32(0.9999999))])
def test_lanes_kernel_long_rows(monkeypatch, gamma):
    # 2^17 + 3 steps, and γ just below 1 in float32.
    rng = np.random.default_rng(17)
    R, T = 9, (1 << 17) + 3
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), gamma=gamma, dones=rng.random((R, T)) < 0.001)
    got, fused = _vt_lanes_and_fused(monkeypatch, **kw)
    _vt_near_fused(got, fused, R, T)
    ref = gt.vtrace(**kw)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)


@pytest.mark.parametrize("T", VT_LANE_LENGTHS)
@pytest.mark.parametrize("R", VT_LANE_ROWS)
def test_lanes_kernel_with_next_values_matches_the_fused_kernel(monkeypatch, R, T):
    # next_values with terminations and truncations: vtrace_lanes_next, the last
    # R % 8 rows through the fused kernel.

    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(R * 31 + T)
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), next_values=random_data(rng, (R, T), np.float32),
              terminated=rng.random((R, T)) < 0.05, truncated=rng.random((R, T)) < 0.05, gamma=0.99,
              last_trace=random_data(rng, (R,), np.float32))
    for extra in ({}, dict(lam=0.9, rho_bar=1.5, c_bar=0.8, pg_rho_bar=0.7,
                           gamma=rng.uniform(0.9, 1.0, (R, 1)).astype(np.float32))):
        _check_lanes_case(monkeypatch, calls, {**kw, **extra}, "vtrace_lanes_next", R, T)


def test_lanes_kernel_with_next_values_nan_stays_in_its_episode(monkeypatch):
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(8)
    R, T, cut = 16, 16 * 20 + 5, 150
    r, v = random_data(rng, (R, T), np.float32), random_data(rng, (R, T), np.float32)
    nv, lr = random_data(rng, (R, T), np.float32), log_ratios(rng, (R, T))
    term, trunc = np.zeros((R, T), bool), np.zeros((R, T), bool)
    trunc[:, cut] = True  # a truncation cuts the carry; its bootstrap is next_values[cut]
    r[:, cut + 1:cut + 20] = np.nan
    v[3, cut + 30] = np.inf
    lr[5, cut + 40] = np.nan
    nv[7, cut + 50] = np.nan
    res = gaescan.vtrace(r, v, lr, gamma=0.99, next_values=nv, terminated=term, truncated=trunc,
                         backend="numba")
    assert np.all(np.isfinite(res.vs[:, :cut + 1])) and np.all(np.isfinite(res.advantages[:, :cut + 1]))
    s = np.s_[:, :cut + 1]
    ref = gt.vtrace(r[s], v[s], lr[s], gamma=0.99, next_values=nv[s], terminated=term[s], truncated=trunc[s])
    assert_close(res.vs[s], ref.vs, np.float32)
    assert_close(res.advantages[s], ref.advantages, np.float32)

# --------------------------------------------------------------------------- time-major lanes
# vtrace_timemajor_lanes (float32 time-major arrays, axis=0, the same terms as
# vtrace_lanes) runs eight batch columns at a time with the batch-major lanes block's
# operations, and the last R % 8 columns one at a time: it gives the batch-major
# lanes call's bits on the transposed arrays.


def _transposed(kw):
    return {k: np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x
            for k, x in kw.items()}


@pytest.mark.parametrize("T", VT_LANE_LENGTHS)
@pytest.mark.parametrize("R", [8, 9, 15, 16, 17, 24, 70])
def test_timemajor_lanes_kernel_gives_the_batch_major_lanes_bits(monkeypatch, R, T):
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    calls = _kernel_calls(monkeypatch)
    rng = np.random.default_rng(R * 7 + T)
    kw = dict(rewards=random_data(rng, (T, R), np.float32), values=random_data(rng, (T, R), np.float32),
              log_rhos=log_ratios(rng, (T, R)), gamma=0.99, last_value=random_data(rng, (R,), np.float32),
              last_trace=random_data(rng, (R,), np.float32))
    for extra in (dict(dones=rng.random((T, R)) < 0.05), {},
                  dict(dones=rng.random((T, R)) < 0.05, lam=0.9, rho_bar=1.5, c_bar=0.8, pg_rho_bar=0.7,
                       gamma=rng.uniform(0.9, 1.0, (1, R)).astype(np.float32))):
        case = {**kw, **extra}
        calls.clear()
        got = gaescan.vtrace(**case, axis=0, backend="numba")
        if T > 1:
            assert calls == ["vtrace_timemajor_lanes"]
        else:  # one step: no time stride to sweep, the batch-major kernels run
            assert "vtrace_timemajor_lanes" not in calls
        bm = _transposed(case)
        if isinstance(bm["gamma"], np.ndarray):
            bm["gamma"] = np.ascontiguousarray(case["gamma"].T)
        want = gaescan.vtrace(**bm, backend="numba")
        assert _vt_same_bits((got.vs.T, got.advantages.T), want)
        ref = gt.vtrace(**case, axis=0)
        assert_close(got.vs, ref.vs, np.float32)
        assert_close(got.advantages, ref.advantages, np.float32)


def test_timemajor_lanes_kernel_checks_the_log_ratios_range_per_16_steps(monkeypatch):
    # One log-ratio outside [-87, 88] in some 16-step spans of some groups of 8
    # columns, at a different step of the span each time: the batch-major block
    # takes the float64 form for its whole 16 steps, and so do the four 4-step
    # time-major blocks of the span.
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(29)
    T, R = 16 * 12 + 5, 26
    lr = log_ratios(rng, (T, R))
    for k, (t, c) in enumerate([(0, 0), (21, 9), (38, 17), (63, 3), (64, 12), (100, 20), (150, 24)]):
        lr[t, c] = (95.0, -95.0, np.inf, -np.inf)[k % 4]
    kw = dict(rewards=random_data(rng, (T, R), np.float32), values=random_data(rng, (T, R), np.float32),
              log_rhos=lr, gamma=0.99, dones=rng.random((T, R)) < 0.02)
    got = gaescan.vtrace(**kw, axis=0, backend="numba")
    want = gaescan.vtrace(**_transposed(kw), backend="numba")
    assert _vt_same_bits((got.vs.T, got.advantages.T), want)
    # (a decision per 4-step block would put the span's other blocks in float32: other bits)
    ref = gt.vtrace(**kw, axis=0)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)


def test_timemajor_lanes_kernel_nan_stays_in_its_episode(monkeypatch):
    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(6)
    R, T, cut = 19, 16 * 20 + 5, 150
    r, v = random_data(rng, (T, R), np.float32), random_data(rng, (T, R), np.float32)
    lr = log_ratios(rng, (T, R))
    d = np.zeros((T, R), bool)
    d[cut] = True
    r[cut + 1:cut + 20] = np.nan
    v[cut + 30, 3] = np.inf
    lr[cut + 40, 18] = np.nan
    res = gaescan.vtrace(r, v, lr, gamma=0.99, dones=d, axis=0, backend="numba")
    assert np.all(np.isfinite(res.vs[:cut + 1])) and np.all(np.isfinite(res.advantages[:cut + 1]))
    ref = gt.vtrace(r[:cut + 1], v[:cut + 1], lr[:cut + 1], gamma=0.99, dones=d[:cut + 1], axis=0)
    assert_close(res.vs[:cut + 1], ref.vs, np.float32)
    assert_close(res.advantages[:cut + 1], ref.advantages, np.float32)


def test_timemajor_lanes_kernel_is_thread_count_independent(monkeypatch):
    import numba

    from gaescan.backends import vtrace_numba

    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    rng = np.random.default_rng(10)
    T, R = 1003, 300  # one unit per thread: 2 units (the last one short) or 1
    r, v = random_data(rng, (T, R), np.float32), random_data(rng, (T, R), np.float32)
    kw = dict(log_rhos=log_ratios(rng, (T, R)), gamma=0.999, lam=0.99, dones=rng.random((T, R)) < 0.01, axis=0)
    a1 = gaescan.vtrace(r, v, **kw, backend="numba")
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a2 = gaescan.vtrace(r, v, **kw, backend="numba")
    finally:
        numba.set_num_threads(n)
    assert _vt_same_bits(a1, a2)
    ref = gt.vtrace(r, v, **kw)
    assert_close(a1.vs, ref.vs, np.float32)


# Rows long enough for the lanes to run shifted apart (lane q q·sk steps after lane 0,
# gaescan.kernels.cpu._lane_span: 16 steps at 3600, 64 at 14368): each lane's steps
# outside its blocks run one row at a time, with the fused kernel's bits; the blocks
# stay within float32 roundings of it, streamed or not, on any thread count.


@pytest.mark.parametrize("case", ["dones", "next"])
@pytest.mark.parametrize("T", [3600, 14368])
@pytest.mark.parametrize("stream", [False, True])
def test_shifted_lanes_match_the_fused_kernel(monkeypatch, case, T, stream):
    from gaescan.backends import numba_cpu, vtrace_numba
    from gaescan.kernels import cpu

    R = 9
    assert cpu._lane_span.py_func(T, 11 if stream else 0, stream)[4] == (16 if T == 3600 else 64)
    calls = _kernel_calls(monkeypatch)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    rng = np.random.default_rng(T)
    kw = dict(rewards=random_data(rng, (R, T), np.float32), values=random_data(rng, (R, T), np.float32),
              log_rhos=log_ratios(rng, (R, T)), gamma=0.99, last_trace=random_data(rng, (R,), np.float32))
    if case == "dones":
        kw.update(dones=rng.random((R, T)) < 0.01, last_value=random_data(rng, (R,), np.float32))
    else:
        kw.update(next_values=random_data(rng, (R, T), np.float32), terminated=rng.random((R, T)) < 0.01,
                  truncated=rng.random((R, T)) < 0.01)
    name = "vtrace_lanes_next" if case == "next" else "vtrace_lanes"
    monkeypatch.setattr(vtrace_numba, "SERIAL_MAX_STEPS", 0)
    got, one = one_thread_and_all(
        lambda: gaescan.vtrace(**kw, backend="numba", out=tuple(aligned_rows_out(R, T, T, 5))))
    assert calls[0] == name
    assert _vt_same_bits(got, one)
    calls.clear()
    with monkeypatch.context() as m:
        m.setattr(vtrace_numba, "_lanes_ok", lambda *a, **k: False)
        m.setattr(vtrace_numba, "_lanes_next_ok", lambda *a: False)
        fused = gaescan.vtrace(**kw, backend="numba")
    assert calls == ["vtrace_fused"]
    _vt_near_fused(got, fused, R, T, 11 if stream else 0)
    ref = gt.vtrace(**kw)
    assert_close(got.vs, ref.vs, np.float32)
    assert_close(got.advantages, ref.advantages, np.float32)
