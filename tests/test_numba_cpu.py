"""Kernel-specific tests of the "numba" backend (gaescan.kernels.cpu)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import aligned_rows_out, one_thread_and_all, run_in_threads

import gaescan
import gaescan.testing as gt
from gaescan import _kept
from gaescan.backends import numba_cpu
from gaescan.kernels import cpu


def _oracle(r, v, gamma, lam, term=None, trunc=None, nv=None, last=0.0, mask=None):
    """``gaescan.testing.gae`` with the arguments spelled as the kernels see them."""
    return gt.gae(r, v, gamma=gamma, lam=lam, terminated=term, truncated=trunc, next_values=nv,
                  last_value=None if nv is not None else last, mask=mask)


def _data(R, T, seed=0, dtype=np.float32, p=0.01):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((R, T)).astype(dtype)
    v = rng.standard_normal((R, T)).astype(dtype)
    d = rng.random((R, T)) < p
    return rng, r, v, d


# Lengths straddling the tile size: head-only, exact tiles, tiles + head.
LENGTHS = [1, 7, 4095, 2 * 4096 + 37]


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_batch_major(T, dtype):
    _, r, v, d = _data(3, T, dtype=dtype)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for dones in (None, d):
        adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=dones, last_value=0.5, backend="numba")
        A, Rt = _oracle(r, v, 0.99, 0.95, term=dones, last=0.5)
        assert adv.dtype == dtype
        assert gt.assert_close(adv, A) <= tol and gt.assert_close(ret, Rt) <= tol


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_time_major(dtype):
    _, r, v, d = _data(300, 600, dtype=dtype)  # (B, T) data; stored time-major
    rT, vT, dT = (np.ascontiguousarray(x.T) for x in (r, v, d))
    gam = np.linspace(0.9, 1.0, 300)[None, :]  # per-row γ in the (T, B) layout
    adv, ret = gaescan.gae(rT, vT, gamma=gam, lam=0.9, dones=dT, axis=0, backend="numba")
    A, Rt = _oracle(r, v, gam.T, 0.9, term=d)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    assert gt.assert_close(adv.T, A) <= tol and gt.assert_close(ret.T, Rt) <= tol
    adv2, _ = gaescan.gae(rT, vT, gamma=gam, lam=0.9, axis=0, backend="numba")
    A2, _ = _oracle(r, v, gam.T, 0.9)
    assert gt.assert_close(adv2.T, A2) <= tol


def test_every_feature_small():
    rng, r, v, d = _data(4, 50, dtype=np.float64, p=0.1)
    trunc = (rng.random((4, 50)) < 0.1) & ~d
    nv = rng.standard_normal((4, 50))
    mask = rng.random((4, 50)) < 0.8
    gam = rng.uniform(0.8, 1.0, (4, 50))
    lam = rng.uniform(0.8, 1.0, (4, 1))
    adv, ret = gaescan.gae(r, v, gamma=gam, lam=lam, terminated=d.astype(np.int32), truncated=trunc,
                           next_values=nv, mask=mask, backend="numba")
    A, Rt = _oracle(r, v, gam, lam, term=d, trunc=trunc, nv=nv, mask=mask)
    assert gt.assert_close(adv, A) <= 1e-12 and gt.assert_close(ret, Rt) <= 1e-12
    assert np.all(adv[~mask] == 0) and np.all(ret[~mask] == 0)
    # float16 / int inputs compute in float32; strided views work
    r16 = r.astype(np.float16)[:, ::2]
    v16 = v.astype(np.float16)[:, ::2]
    adv, _ = gaescan.gae(r16, v16, gamma=0.9, lam=0.8, dones=d[:, ::2].astype(np.float32), backend="numba")
    A, _ = _oracle(r16, v16, 0.9, 0.8, term=d[:, ::2])
    assert adv.dtype == np.float32 and gt.assert_close(adv, A) <= 2e-5


def test_packed_segments():
    _, r, v, d = _data(1, 40, dtype=np.float64)
    cu = np.array([0, 5, 5, 17, 40])
    adv, _ = gaescan.gae(r[0], v[0], gamma=0.9, lam=0.7, cu_seqlens=cu, last_value=np.arange(4.0),
                         backend="numba")
    for s in range(4):
        lo, hi = cu[s], cu[s + 1]
        if hi > lo:
            A, _ = _oracle(r[:, lo:hi], v[:, lo:hi], 0.9, 0.7, last=float(s))
            np.testing.assert_allclose(adv[lo:hi], A[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [4096 * 2 + 5])
def test_nan_isolation_fast(T):
    _, r, v, _ = _data(2, T)
    d = np.zeros((2, T), bool)
    cut = 1024 + 3  # a done inside a chain, with a NaN episode after it
    d[:, cut] = True
    r[:, cut + 1:cut + 50] = np.nan
    adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")
    assert np.all(np.isfinite(adv[:, :cut + 1])) and np.all(np.isfinite(ret[:, :cut + 1]))
    A, _ = _oracle(r[:, :cut + 1], v[:, :cut + 1], 0.99, 0.95, term=d[:, :cut + 1])
    assert gt.assert_close(adv[:, :cut + 1], A) <= 2e-5


def test_deterministic_and_inputs_untouched():
    _, r, v, d = _data(8, 3 * 4096 + 11)
    copies = [x.copy() for x in (r, v, d)]
    a1, a2 = (x[0] for x in one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")))
    assert np.array_equal(a1, a2)
    for x, c in zip((r, v, d), copies, strict=True):
        assert np.array_equal(x, c)


def test_thread_safety():
    """8 threads run the parallel batch-major and time-major kernels at once
    (above SERIAL_MAX_STEPS), in this process's threading layer; every
    result equals the single-thread result.  Every layer in a subprocess:
    tests/test_threading.py."""
    from gaescan.backends import numba_cpu

    R, T = 16, 4096 + 100
    assert R * T > numba_cpu.SERIAL_MAX_STEPS
    _, r, v, d = _data(R, T)
    ref, _ = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")
    rT, vT, dT = (np.ascontiguousarray(x.T) for x in (r, v, d))
    refT, _ = gaescan.gae(rT, vT, gamma=0.99, lam=0.95, dones=dT, axis=0, backend="numba")

    def work(k):
        for _ in range(5):
            a, _ = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")
            b, _ = gaescan.gae(rT, vT, gamma=0.99, lam=0.95, dones=dT, axis=0, backend="numba")
            assert np.array_equal(a, ref) and np.array_equal(b, refT), k

    errors = run_in_threads(work)
    assert not errors


@pytest.mark.parametrize("time_major", [False, True])
def test_extra_memory_is_o_rows(time_major):
    R, T = 64, 4096
    _, r, v, d = _data(R, T)
    if time_major:
        r, v, d = (np.ascontiguousarray(x.T) for x in (r, v, d))
    axis = 0 if time_major else -1
    adv, ret = np.empty_like(r), np.empty_like(r)
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, out=(adv, ret), backend="numba")
    tracemalloc.start()
    try:
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=axis, out=(adv, ret), backend="numba")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * R + 64 * 1024, peak  # far below one input (R*T*4 = 1 MiB)


def test_int64_indexing_logic():
    # Hot loops index with uint64; exercise the tile/head arithmetic on a
    # strided view whose byte offsets exceed 2**31 would need >2 GiB, so check
    # the index bookkeeping on a large-stride view instead.
    big = np.zeros((2, 2 * 4096 + 3, 64), np.float32)
    rng = np.random.default_rng(3)
    big[..., 5] = rng.standard_normal(big.shape[:2])
    r = big[..., 5]
    v = big[..., 5][::-1]
    adv, _ = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba")
    A, _ = _oracle(r, v, 0.99, 0.95)
    assert gt.assert_close(adv, A) <= 2e-5


def test_specialisation_counts():
    for k in (cpu.gae_rows_fused, cpu.gae_rows_fused_1t, cpu.gae_rows_fused_c, cpu.gae_rows_fused_1t_c,
              cpu.gae_timemajor, cpu.gae_rows, cpu.returns_rows, cpu.returns_rows_fused,
              cpu.returns_rows_fused_1t, cpu.scan_rows):
        assert len(k.signatures) == 2, (k, k.signatures)
    # a call compiles its dtype's build, closed to that one signature, and
    # other argument layouts (C-contiguous here, "A" in the signature) reuse it
    # (a = 0.5 takes the float32-state build, a = 1 the float64-state one)
    x = np.zeros((2, 5), np.float32)
    for a, builds, key in [(0.5, cpu.scan_rows._narrow_builds, False),
                           (1.0, cpu.scan_rows._builds, (np.dtype(np.float32), False))]:
        gaescan.linear_scan(a, x, backend="numba")
        build = builds[key]
        gaescan.linear_scan(a, np.zeros((4, 9), np.float32)[::2, ::3], backend="numba")
        assert len(build.signatures) == 1


# ------------------------------------------------------------- returned vs out= outputs


@pytest.mark.parametrize("shape", [(8, 1024), (1024,), (2, 3, 50), (64, 1024)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_returned_outputs_equal_out_outputs(shape, dtype):
    """Same bits with and without ``out=``, on both sides of the
    single-thread threshold."""
    rng = np.random.default_rng(1)
    r = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    d = rng.random(shape) < 0.05
    m = rng.random(shape) < 0.8
    for dones, mask in ((None, None), (d, None), (d.view(np.uint8), None), (None, m), (d, m.view(np.int8))):
        if mask is not None:
            r = r.copy()
            r[~m] = np.nan  # never read
        fast = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=dones, mask=mask, last_value=0.25)
        out = (np.empty(shape, dtype), np.empty(shape, dtype))
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=dones, mask=mask, last_value=0.25, out=out)
        assert fast.advantages.dtype == dtype and fast.advantages.shape == shape
        np.testing.assert_array_equal(fast.advantages, out[0])
        np.testing.assert_array_equal(fast.returns, out[1])
        assert np.isfinite(fast.advantages).all()


def test_scalar_coefficients_flags_and_axes():
    r = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError, match="gamma"):
        gaescan.gae(r, r, gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match="lam"):
        gaescan.gae(r, r, gamma=0.9, lam=float("nan"))
    with pytest.raises(ValueError, match="shape"):
        gaescan.gae(r, r[:, :4].copy(), gamma=0.9, lam=0.9)
    # NumPy scalars are weak, as on the general path; float64 arrays are not
    assert gaescan.gae(r, r, gamma=np.float64(0.9), lam=0.9).advantages.dtype == np.float32
    assert gaescan.gae(r, r.astype(np.float64), gamma=0.9, lam=0.9).advantages.dtype == np.float64
    # flags wider than a byte, non-contiguous views, other axes: same answer
    d = np.zeros((2, 5), np.int32)
    d[0, 2] = 1
    a = gaescan.gae(r, r, gamma=0.9, lam=0.9, dones=d).advantages
    b = gaescan.gae(r.T, r.T, gamma=0.9, lam=0.9, dones=d.T, axis=0).advantages
    np.testing.assert_array_equal(a, b.T)
    assert gaescan.gae(r, r, gamma=1, lam=0, dones=d.astype(bool)).advantages.dtype == np.float32


@pytest.mark.parametrize("serial_max", [0, 1 << 30], ids=["thread-pool", "calling-thread"])
@pytest.mark.parametrize("R", [1, 2, 3, 5, 8])
def test_row_pairs_keep_their_own_coefficients(monkeypatch, serial_max, R):
    """Rows run in pairs: each row of a pair (and an odd last row) must use its
    own γ, λ, last_value and last_advantage."""
    from gaescan.backends import numba_cpu

    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", serial_max)
    rng, r, v, d = _data(R, 301, seed=R, p=0.02)
    gamma = rng.uniform(0.8, 1.0, (R, 1)).astype(np.float32)
    lam = rng.uniform(0.5, 1.0, (R, 1)).astype(np.float32)
    last = rng.standard_normal(R).astype(np.float32)
    carry = rng.standard_normal(R).astype(np.float32)
    for dones in (None, d):
        adv, ret = gaescan.gae(r, v, gamma=gamma, lam=lam, dones=dones, last_value=last,
                               last_advantage=carry, backend="numba")
        A, Rt = _oracle(r, v, gamma, lam, term=dones, last=last)
        # the carry enters as A_T: add its discounted contribution to the oracle
        decay = np.where(np.asarray(dones if dones is not None else np.zeros_like(d)), 0.0,
                         gamma.astype(np.float64) * lam.astype(np.float64))
        P = np.cumprod(decay[:, ::-1], axis=1)[:, ::-1] * carry[:, None]
        assert gt.assert_close(adv, A + P) <= 2e-5 and gt.assert_close(ret, Rt + P) <= 2e-5
    # the next_values and mask loops, against the reference oracle
    nv = rng.standard_normal(r.shape).astype(np.float32)
    tr = rng.random(r.shape) < 0.02
    for kw in (dict(next_values=nv), dict(next_values=nv, terminated=d), dict(next_values=nv, truncated=tr),
               dict(next_values=nv, terminated=d, truncated=tr), dict(mask=rng.random(r.shape) < 0.7, dones=d),
               dict(mask=rng.random(r.shape) < 0.7, last_value=last)):
        kw.update(rewards=r, values=v, gamma=gamma, lam=lam, last_advantage=carry)
        adv, ret = gaescan.gae(backend="numba", **kw)
        ref_adv, ref_ret = gt.gae(**kw)
        assert gt.assert_close(adv, ref_adv) <= 2e-5 and gt.assert_close(ret, ref_ret) <= 2e-5


@pytest.mark.parametrize("R", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_returns_rows_keep_their_own_coefficients(build_spy, monkeypatch, R, dtype):
    """Discounted returns with scalar or per-row γ and no mask take the fused
    kernels (rows in pairs, an odd last row as both chains): each row keeps its
    own γ and last_value, and the thread pool and the calling thread give the
    same bits."""
    from gaescan.backends import numba_cpu as nc

    rng, r, _, d = _data(R, 293, seed=R, p=0.02)
    r = r.astype(dtype)
    per_row = rng.uniform(0.8, 1.0, (R, 1)).astype(dtype)
    last = rng.standard_normal(R).astype(dtype)
    for gamma in (0.9, 0.9999, per_row):
        for dones in (None, d):
            got = {}
            for serial_max in (0, 1 << 30):
                monkeypatch.setattr(nc, "SERIAL_MAX_STEPS", serial_max)
                build_spy.clear()
                got[serial_max] = gaescan.discounted_returns(r, gamma=gamma, dones=dones, last_value=last,
                                                             backend="numba")
                want = ["returns_rows_fused_1t"] if serial_max else (
                    ["returns_lanes"] if R >= 8 and dtype == np.float32 else ["returns_rows_fused"])
                assert [k for k, _ in build_spy] == want
            assert got[0].tobytes() == got[1 << 30].tobytes()
            ref = gt.discounted_returns(r, gamma=gamma, dones=dones, last_value=last)
            assert gt.assert_close(got[0], ref) <= gt.tolerance(dtype)


# ----------------------------------------------- time-major general kernels


@pytest.mark.parametrize("R", [2, 33, 130, 2100], ids=lambda r: f"B{r}")
@pytest.mark.parametrize("feature", ["mask", "term+trunc+next", "trunc+strided-next", "per-step-coefs", "carry"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_time_major_general_gae(R, feature, dtype):
    """Time-major (axis=0) calls beyond the fused path sweep blocks of batch
    columns (gae_tm): every feature, across block widths."""
    from conftest import assert_close, assert_zero_where

    rng = np.random.default_rng(R)
    T = 37 if R > 1000 else 211
    r = rng.standard_normal((T, R)).astype(dtype)
    v = rng.standard_normal((T, R)).astype(dtype)
    kw = dict(rewards=r, values=v, gamma=0.97, lam=0.9, axis=0,
              dones=rng.random((T, R)) < 0.03, last_value=rng.standard_normal(R).astype(dtype))
    if feature == "mask":
        kw["mask"] = rng.random((T, R)) < 0.8
    elif feature == "term+trunc+next":
        del kw["dones"], kw["last_value"]
        kw.update(terminated=rng.random((T, R)) < 0.03, truncated=rng.random((T, R)) < 0.03,
                  next_values=rng.standard_normal((T, R)).astype(dtype))
    elif feature == "trunc+strided-next":
        # next_values not contiguous: the general sweep instead of the fused kernel
        del kw["dones"], kw["last_value"]
        kw.update(truncated=rng.random((T, R)) < 0.03,
                  next_values=rng.standard_normal((T, 2 * R)).astype(dtype)[:, ::2],
                  last_advantage=rng.standard_normal(R).astype(dtype))
    elif feature == "per-step-coefs":
        kw["gamma"] = rng.uniform(0.9, 1.0, (T, R)).astype(dtype)
        kw["lam"] = rng.uniform(0.8, 1.0, (T, 1)).astype(dtype)
    else:
        kw["last_advantage"] = rng.standard_normal(R).astype(dtype)
        kw["mask"] = rng.random((T, R)) < 0.9
    adv, ret = gaescan.gae(backend="numba", **kw)
    ref_adv, ref_ret = gt.gae(**kw)
    assert_close(adv, ref_adv, dtype)
    assert_close(ret, ref_ret, dtype)
    if "mask" in kw:
        assert_zero_where(adv, kw["mask"])


@pytest.mark.parametrize("R", [2, 130, 2100], ids=lambda r: f"B{r}")
def test_time_major_returns_and_scans(R):
    from conftest import assert_close

    rng = np.random.default_rng(R)
    T = 53
    r = rng.standard_normal((T, R)).astype(np.float32)
    d = rng.random((T, R)) < 0.05
    m = rng.random((T, R)) < 0.8
    lv = rng.standard_normal(R).astype(np.float32)
    g = rng.uniform(0.9, 1.0, (T, R)).astype(np.float32)
    got = gaescan.discounted_returns(r, gamma=g, dones=d, mask=m, last_value=lv, axis=0, backend="numba")
    assert_close(got, gt.discounted_returns(r, gamma=g, dones=d, mask=m, last_value=lv, axis=0), np.float32)
    a = np.where(rng.random((T, R)) < 0.1, 0.0, g).astype(np.float32)
    for reverse in (False, True):
        got = gaescan.linear_scan(a, r, reverse=reverse, initial=lv, axis=0, backend="numba")
        assert_close(got, gt.linear_scan(a, r, reverse=reverse, initial=lv, axis=0), np.float32)


# ------------------------------------------------------------ float32-state builds


@pytest.fixture
def build_spy(monkeypatch):
    """Record ``(kernel name, "f32" | "f64")``: which state build each
    top-level kernel call of a float32 output runs."""
    calls = []
    plain_call, f32_call = cpu.Kernel.__call__, cpu.Kernel.f32_state

    def plain(self, *args):
        calls.append((self.__name__, "f64"))
        return plain_call(self, *args)

    def narrow(self, *args):
        if args[-1].dtype == np.float32:
            calls.append((self.__name__, "f32"))
        return f32_call(self, *args)

    real_caller = cpu.Kernel.caller

    def caller(self, dtype, narrow=False):
        # a serial kernel's caller is its build itself: record its calls too
        build = real_caller(self, dtype, narrow)
        if self.parallel:
            return build  # __call__ or f32_state, recorded above
        state = "f32" if narrow and self.narrow and np.dtype(dtype) == np.float32 else "f64"

        def recorded(*args):
            calls.append((self.__name__, state))
            return build(*args)

        return recorded

    monkeypatch.setattr(cpu.Kernel, "__call__", plain)
    monkeypatch.setattr(cpu.Kernel, "f32_state", narrow)
    monkeypatch.setattr(cpu.Kernel, "caller", caller)
    # preparations and kept calls made before hold unrecorded callers
    numba_cpu._PREPS.clear()
    _kept.clear()
    yield calls
    numba_cpu._PREPS.clear()
    _kept.clear()


_F4_MAX = float(np.float32(0.99))  # F32_STATE_MAX_DECAY, a float32 value
_F4_OVER = float(np.nextafter(np.float32(0.99), np.float32(1)))


def _gae_spy_case(name, dtype, rng):
    R, T = 4, 300
    r = rng.standard_normal((R, T)).astype(dtype)
    v = rng.standard_normal((R, T)).astype(dtype)
    d = rng.random((R, T)) < 0.05
    m = rng.random((R, T)) < 0.9
    per_row = np.array([[0.9], [0.99], [0.5], [_F4_MAX]], dtype=dtype)
    cases = {
        # name: (call, expected state, kernel)
        "scalar": (dict(gamma=0.99, lam=0.95, dones=d), "f32", "gae_rows_fused_1t_c"),
        "scalar-at-limit": (dict(gamma=_F4_MAX, lam=1.0, dones=d), "f32", "gae_rows_fused_1t_c"),
        "scalar-over-limit": (dict(gamma=_F4_OVER, lam=1.0, dones=d), "f64", "gae_rows_fused_1t_c"),
        # γ enters δ once per step: only γλ counts
        "gamma-near-1-small-lam": (dict(gamma=0.9999999, lam=0.9), "f32", "gae_rows_fused_1t_c"),
        "lam-near-1": (dict(gamma=1.0, lam=0.99999), "f64", "gae_rows_fused_1t_c"),
        "per-row": (dict(gamma=per_row, lam=1.0, dones=d), "f32", "gae_rows_fused_1t_c"),
        "per-row-one-over": (dict(gamma=np.where(per_row == 0.5, 0.99999, per_row).astype(dtype), lam=1.0, dones=d),
                             "f64", "gae_rows_fused_1t_c"),
        "per-step": (dict(gamma=np.full((R, T), 0.5, dtype), lam=0.5, dones=d), "f64", "gae_rows"),
        "per-step-lam": (dict(gamma=0.5, lam=np.full((R, T), 0.5, dtype)), "f64", "gae_rows"),
        "mask": (dict(gamma=0.99, lam=0.95, dones=d, mask=m), "f32", "gae_rows_fused_1t_c"),
        "next+mask": (dict(gamma=0.99, lam=0.95, next_values=v, terminated=d, mask=m), "f32", "gae_rows"),
        "packed": (dict(gamma=0.99, lam=0.95, cu_seqlens=np.array([0, 17, R * T])), "f32", "gae_rows"),
        "packed-near-1": (dict(gamma=0.99999, lam=1.0, cu_seqlens=np.array([0, 17, R * T])), "f64",
                          "gae_rows"),
        "time-major": (dict(gamma=0.99, lam=0.95, dones=d, axis=0), "f32", "gae_timemajor"),
        "time-major-next": (dict(gamma=0.99, lam=0.95, next_values=v, terminated=d, axis=0), "f32",
                            "gae_timemajor_next"),
        "time-major-mask": (dict(gamma=0.99, lam=0.95, dones=d, mask=m, axis=0), "f32", "gae_tm"),
        "time-major-near-1": (dict(gamma=0.99999, lam=1.0, dones=d, axis=0), "f64", "gae_timemajor"),
    }
    kw, state, kernel = cases[name]
    if kw.get("axis") == 0:
        kw = {k: np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x
              for k, x in kw.items()}
        r, v = np.ascontiguousarray(r.T), np.ascontiguousarray(v.T)
    if "cu_seqlens" in kw:
        r, v = r.reshape(-1), v.reshape(-1)
    return r, v, kw, state, kernel


_GAE_SPY = ["scalar", "scalar-at-limit", "scalar-over-limit", "gamma-near-1-small-lam", "lam-near-1",
            "per-row", "per-row-one-over", "per-step", "per-step-lam", "mask", "next+mask", "packed",
            "packed-near-1", "time-major", "time-major-next", "time-major-mask", "time-major-near-1"]


@pytest.mark.parametrize("name", _GAE_SPY)
def test_gae_state_build_choice(build_spy, name):
    r, v, kw, state, kernel = _gae_spy_case(name, np.float32, np.random.default_rng(3))
    adv, ret = gaescan.gae(r, v, **kw, backend="numba")
    assert build_spy == [(kernel, state)]
    A, Rt = gt.gae(r, v, **kw)
    gt.assert_close(adv, A, dtype=np.float32)
    gt.assert_close(ret, Rt, dtype=np.float32)
    # float64 outputs always run the float64 build
    build_spy.clear()
    r64, v64, kw64, _, _ = _gae_spy_case(name, np.float64, np.random.default_rng(3))
    gaescan.gae(r64, v64, **kw64, backend="numba")
    assert [s for _, s in build_spy] == ["f64"] * len(build_spy) and build_spy


# The fused pair kernels have a build for C-contiguous rows (``*_c``: the inner
# stride known when compiling) beside the one for any strides.  The same data as
# C-contiguous arrays and as strided views: each build where it should run, the
# same bits from both.  R = 5 keeps float32 rows off the lanes kernel (8 rows or
# more), so both sides of SERIAL_MAX_STEPS run a pair kernel.
_LAYOUT_CASES = {
    "dones": lambda d, t, nv: dict(dones=d),
    "plain": lambda d, t, nv: {},
    "mask": lambda d, t, nv: dict(dones=d, mask=t),
    "next+both-flags": lambda d, t, nv: dict(next_values=nv, terminated=d, truncated=t),
    "next+term-only": lambda d, t, nv: dict(next_values=nv, terminated=d),
    # an absent termination flag is a zero-stride view: the strided build runs
    "next+trunc-only": lambda d, t, nv: dict(next_values=nv, truncated=t),
}


@pytest.mark.parametrize("case", list(_LAYOUT_CASES))
@pytest.mark.parametrize("T", [257, 8193], ids=["serial", "parallel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_layout_builds_give_the_same_bits(build_spy, case, T, dtype):
    R = 5
    rng = np.random.default_rng(11)
    data = [rng.standard_normal((R, T)).astype(dtype) for _ in range(3)]
    flags = [rng.random((R, T)) < p for p in (0.03, 0.5)]
    data[1][2, T // 3] = np.nan  # a NaN stays in its episode in both builds

    def strided(x):
        y = np.zeros((R, 2 * T), x.dtype)[:, ::2]
        y[...] = x
        return y

    outs = {}
    for layout, f in (("C", lambda x: x), ("strided", strided)):
        r, v, nv = (f(x) for x in data)
        kw = _LAYOUT_CASES[case](f(flags[0]), f(flags[1]), nv)
        c_build = layout == "C" and case != "next+trunc-only"
        suffix = "_1t" if R * T <= numba_cpu.SERIAL_MAX_STEPS else ""
        _kept.clear()
        for _ in range(2):  # the route, then the kept call's replay
            build_spy.clear()
            got = gaescan.gae(r, v, gamma=0.99, lam=0.95, **kw)
            names = {name for name, _ in build_spy}
            assert names == {f"gae_rows_fused{suffix}{'_c' if c_build else ''}"}, names
            if layout in outs:
                assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(got, outs[layout], strict=True))
            outs[layout] = got
    for x, y in zip(outs["C"], outs["strided"], strict=True):
        assert np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y))
    A, Rt = gt.gae(*data[:2], gamma=0.99, lam=0.95, **_LAYOUT_CASES[case](*flags, data[2]))
    for got, want in ((outs["C"][0], A), (outs["C"][1], Rt)):
        ok = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), ok)
        gt.assert_close(got[ok], want[ok], dtype=dtype)


@pytest.mark.parametrize(("gamma", "state"), [
    (0.99, "f32"), (_F4_MAX, "f32"), (_F4_OVER, "f64"), (0.9999, "f64"), (0.99999, "f64"),
    (np.array([[0.9], [0.99]], np.float32), "f32"), (np.array([[0.9], [0.999995]], np.float32), "f64"),
    (np.full((2, 50), 0.5, np.float32), "f64"),
], ids=["0.99", "limit", "over", "0.9999", "0.99999", "per-row", "per-row-over", "per-step"])
@pytest.mark.parametrize("layout", ["rows", "time-major", "packed"])
def test_returns_state_build_choice(build_spy, gamma, state, layout):
    r = np.random.default_rng(4).standard_normal((2, 50)).astype(np.float32)
    kw = {}
    if layout == "time-major":
        r, kw = np.ascontiguousarray(r.T), {"axis": 0}
        gamma = np.ascontiguousarray(gamma.T) if isinstance(gamma, np.ndarray) else gamma
        kernel = "returns_tm"
    elif layout == "packed":
        if isinstance(gamma, np.ndarray):
            gamma = gamma.reshape(-1) if gamma.shape[1] > 1 else float(gamma.max())
        r, kw = r.reshape(-1), {"cu_seqlens": np.array([0, 30, 100])}
        kernel = "returns_rows"
    else:
        # scalar and per-row γ take the fused kernel (serial at this size), per-step γ the general one
        per_step = isinstance(gamma, np.ndarray) and gamma.shape[1] > 1
        kernel = "returns_rows" if per_step else "returns_rows_fused_1t"
    out = gaescan.discounted_returns(r, gamma=gamma, **kw, backend="numba")
    if layout == "packed" and isinstance(gamma, float):
        state = "f32" if gamma <= _F4_MAX else "f64"
    assert build_spy == [(kernel, state)]
    gt.assert_close(out, gt.discounted_returns(r, gamma=gamma, **kw), dtype=np.float32)


@pytest.mark.parametrize(("a", "state"), [
    (0.5, "f32"), (-0.99, "f32"), (-_F4_MAX, "f32"), (-_F4_OVER, "f64"), (1.0, "f64"),
    (np.array([[0.9], [-0.99]], np.float32), "f32"), (np.array([[0.9], [-0.99999]], np.float32), "f64"),
    (np.full((2, 50), 0.5, np.float32), "f64"),
], ids=["0.5", "-0.99", "-limit", "-over", "1", "per-row", "per-row-over", "per-step"])
@pytest.mark.parametrize("layout", ["rows", "time-major"])
def test_scan_state_build_choice(build_spy, a, state, layout):
    b = np.random.default_rng(5).standard_normal((2, 50)).astype(np.float32)
    kw, kernel = {}, "scan_rows"
    if layout == "time-major":
        b, kw, kernel = np.ascontiguousarray(b.T), {"axis": 0}, "scan_tm"
        a = np.ascontiguousarray(a.T) if isinstance(a, np.ndarray) else a
    y = gaescan.linear_scan(a, b, **kw, backend="numba")
    assert build_spy == [(kernel, state)]
    gt.assert_close(y, gt.linear_scan(a, b, **kw), dtype=np.float32)


def test_f32_state_limit():
    from gaescan.backends import numba_cpu

    assert numba_cpu.F32_STATE_MAX_DECAY == _F4_MAX


def test_f32_state_builds_are_distinct():
    """The float32-state build is its own dispatcher under its own name (the
    disk cache keys on names), and float64 has none."""
    cpu.scan_rows.f32_state(np.zeros((1, 3), np.float32), np.ones((1, 3), np.float32), False,
                            np.zeros(1, np.float32), out := np.empty((1, 3), np.float32))
    assert np.array_equal(out, np.ones((1, 3)))
    assert cpu.scan_rows.compiled(np.float32, narrow=True)
    narrow = cpu.scan_rows._narrow_builds[False]
    assert narrow.py_func.__qualname__.endswith("_f4")
    assert narrow is not cpu.scan_rows._builds.get((np.dtype(np.float32), False))
    with pytest.raises(TypeError, match="float32-state"):
        cpu.scan_rows.compile(np.float64, narrow=True)


def test_state_helpers_cover_every_state_helper():
    """The float32-state builds rebind ``_f8`` in copies of the helpers named
    in ``_STATE_HELPERS``: every njit helper that reads ``_f8`` or calls such
    a helper is named there (else its float32-state copy would keep float64)."""
    from numba.core.registry import CPUDispatcher

    helpers = {n: f for n, f in vars(cpu).items() if isinstance(f, CPUDispatcher)}
    assert set(cpu._STATE_HELPERS) <= set(helpers)
    state = set(cpu._STATE_HELPERS)
    for name, f in helpers.items():
        names = set(f.py_func.__code__.co_names)
        if "_f8" in names or names & state:
            assert name in state, name
    for k in cpu.all_kernels():
        if not k.narrow:
            continue
        names = set(k.py_func.__code__.co_names)
        assert "_f8" in names or names & state, k.__name__


# ------------------------------------------------------------ lengths

_P = 128
# Lengths around a power of two and its small multiples (one step either
# side of _P, 2 * _P and 3 * _P), primes, 2**17.
LENGTHS = [1, _P - 1, _P, _P + 1, 2 * _P + 1, 3 * _P - 1, 3 * _P + 1, 1031, 4099, 1 << 17]


def _length_cases(T, dtype):
    """``(name, function, arguments)``: every batch-major kernel path, on
    three rows (a pair and a lone row) of ``T`` steps."""
    rng, r, v, d = _data(3, T, seed=T, dtype=dtype, p=0.01)
    nv = rng.standard_normal((3, T)).astype(dtype)
    tr = rng.random((3, T)) < 0.01
    m = rng.random((3, T)) < 0.8
    g = rng.uniform(0.9, 1.0, (3, T)).astype(dtype)
    a = np.where(rng.random((3, T)) < 0.01, 0, g).astype(dtype)
    N = 3 * T
    # segments of unequal lengths (segments run in pairs: the second of the
    # first pair is the longer one, the first of the second pair), a lone one
    cu = np.unique(np.clip([0, 5, T + _P + 1, 2 * T + 3, N - 2 * _P - 1, N], 0, N))
    gae, ret, scan = gaescan.gae, gaescan.discounted_returns, gaescan.linear_scan
    return [
        ("gae dones", gae, dict(rewards=r, values=v, gamma=0.99, lam=0.95, dones=d, last_value=0.5)),
        ("gae plain", gae, dict(rewards=r, values=v, gamma=0.999, lam=0.95)),
        ("gae mask", gae, dict(rewards=r, values=v, gamma=0.99, lam=0.95, mask=m)),
        ("gae mask dones", gae, dict(rewards=r, values=v, gamma=0.99, lam=0.95, mask=m, dones=d)),
        ("gae next term trunc", gae, dict(rewards=r, values=v, gamma=0.99, lam=0.95, next_values=nv,
                                          terminated=d, truncated=tr)),
        ("gae next mask (general)", gae, dict(rewards=r, values=v, gamma=0.99, lam=0.95, next_values=nv,
                                              terminated=d, mask=m)),
        ("gae per-step gamma (general)", gae, dict(rewards=r, values=v, gamma=g, lam=0.95, dones=d)),
        ("gae packed", gae, dict(rewards=r.reshape(-1), values=v.reshape(-1), gamma=0.99, lam=0.95,
                                 cu_seqlens=cu, last_value=np.arange(len(cu) - 1, dtype=dtype))),
        ("returns dones mask", ret, dict(rewards=r, gamma=0.99, dones=d, mask=m, last_value=0.25)),
        ("returns packed", ret, dict(rewards=r.reshape(-1), gamma=g.reshape(-1), cu_seqlens=cu)),
        ("scan forward", scan, dict(a=a, b=r, initial=np.ones(3, dtype))),
        ("scan reverse", scan, dict(a=a, b=r, reverse=True, initial=np.ones(3, dtype))),
    ]


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lengths_every_path(T, dtype):
    """Every batch-major path, on lengths around powers of two and primes,
    against the float64 reference of ``gaescan.testing``."""
    gae_fn = gaescan.gae
    for name, fn, kw in _length_cases(T, dtype):
        got = fn(**kw, backend="numba")
        ref = getattr(gt, fn.__name__)(**kw)
        pairs = zip(got, ref, strict=True) if fn is gae_fn else [(got, ref)]
        for x, y in pairs:
            assert x.dtype == dtype, name
            gt.assert_close(x, y, dtype=dtype)


@pytest.mark.parametrize("T", [_P + 1, 3 * _P + 1])
def test_reversed_and_strided_views(T):
    """Negative and non-unit strides along time (every address follows the
    strides): same bits as on contiguous copies."""
    _, r, v, d = _data(3, 2 * T, seed=7)
    for view in (np.s_[:, ::-1], np.s_[:, ::2], np.s_[:, ::-3]):
        rv, vv, dv = r[view], v[view], d[view]
        a, b = gaescan.gae(rv, vv, gamma=0.99, lam=0.95, dones=dv, backend="numba")
        rc, vc, dc = (np.ascontiguousarray(x) for x in (rv, vv, dv))
        c, e = gaescan.gae(rc, vc, gamma=0.99, lam=0.95, dones=dc, backend="numba")
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, e)
        y = gaescan.linear_scan(0.9, rv, reverse=True, backend="numba")
        np.testing.assert_array_equal(y, gaescan.linear_scan(0.9, rc, reverse=True, backend="numba"))


# --------------------------------------------------------------------------- eight rows in SIMD lanes
# gae_lanes (float32, plain or with terminations, above SERIAL_MAX_STEPS) runs rows
# 8 at a time and the last R % 8 rows in pairs.  It gives the pair kernel's bits:
# each case runs once through it (SERIAL_MAX_STEPS = 0) and once on the calling
# thread's pair kernel, and compares the bits and the reference.

LANE_ROWS = [8, 9, 15, 16, 17, 24]
LANE_LENGTHS = [1, 7, 8, 15, 16, 17, 32, 33, 61, 131]  # around the 16-step block, and primes


def _lanes_and_pairs(monkeypatch, r, v, **kw):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    got = gaescan.gae(r, v, backend="numba", **kw)
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
    pairs = gaescan.gae(r, v, backend="numba", **kw)
    return got, pairs


def _same_bits(a, b):
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("T", LANE_LENGTHS)
@pytest.mark.parametrize("R", LANE_ROWS)
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
def test_lanes_kernel_gives_the_pair_kernels_bits(build_spy, monkeypatch, R, T, decay):
    rng, r, v, d = _data(R, T, seed=R * 1000 + T, p=0.05)
    gamma, lam = (0.99, 0.95) if decay == "f32-state" else (0.999, 0.999)
    last = rng.standard_normal(R).astype(np.float32)
    carry = rng.standard_normal(R).astype(np.float32)
    for dones in (d, None):
        build_spy.clear()
        got, pairs = _lanes_and_pairs(monkeypatch, r, v, gamma=gamma, lam=lam, dones=dones, last_value=last,
                                      last_advantage=carry)
        state = "f32" if decay == "f32-state" else "f64"
        want_calls = [("gae_lanes", state)] + ([("gae_rows_fused", state)] if R % 8 else [])
        assert build_spy[:len(want_calls)] == want_calls
        assert _same_bits(got, pairs)
        ref = gt.gae(r, v, gamma=gamma, lam=lam, dones=dones, last_value=last, last_advantage=carry)
        assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


@pytest.mark.parametrize("view", ["wider-rows", "reversed-rows", "strided-out", "steps-strided", "bool-dones",
                                  "int8-dones"])
def test_lanes_kernel_views(monkeypatch, view):
    # Rows addressed by their stride (wider buffers, reversed order, out= views);
    # arrays not contiguous along time take the pair kernel; flags of any one-byte type.
    rng, r, v, d = _data(19, 203, seed=7, p=0.03)
    kw = dict(gamma=0.99, lam=0.95, dones=d)
    if view == "wider-rows":
        wr, wv = (np.zeros((19, 260), np.float32) for _ in range(2))
        wr[:, 3:206], wv[:, 3:206] = r, v
        r, v = wr[:, 3:206], wv[:, 3:206]
    elif view == "reversed-rows":
        r, v, kw["dones"] = r[::-1], v[::-1], d[::-1]
    elif view == "strided-out":
        outs = (np.full((19, 300), np.nan, np.float32), np.full((19, 300), np.nan, np.float32))
        kw["out"] = (outs[0][:, 50:253], outs[1][:, 50:253])
    elif view == "steps-strided":
        wr = np.zeros((19, 406), np.float32)
        wr[:, ::2] = r
        r = wr[:, ::2]
    elif view == "int8-dones":
        kw["dones"] = d.astype(np.int8)
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, **kw)
    assert _same_bits(got, pairs)
    ref = gt.gae(r, v, **{k: x for k, x in kw.items() if k != "out"})
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5
    if view == "strided-out":
        assert got[0] is kw["out"][0] and np.all(np.isnan(outs[0][:, :50])) and np.all(np.isnan(outs[0][:, 253:]))


def test_lanes_kernel_nan_stays_in_its_episode(monkeypatch):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    _, r, v, _ = _data(16, 16 * 20 + 5)
    d = np.zeros(r.shape, bool)
    cut = 150
    d[:, cut] = True
    r[:, cut + 1:cut + 20] = np.nan
    v[3, cut + 30] = np.inf
    adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba")
    assert np.all(np.isfinite(adv[:, :cut + 1])) and np.all(np.isfinite(ret[:, :cut + 1]))
    A, _ = _oracle(r[:, :cut + 1], v[:, :cut + 1], 0.99, 0.95, term=d[:, :cut + 1])
    assert gt.assert_close(adv[:, :cut + 1], A) <= 2e-5


def test_lanes_kernel_is_thread_count_independent(monkeypatch):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    _, r, v, d = _data(40, 1000 + 3)
    a1, a2 = one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.999, lam=0.99, dones=d, backend="numba"))
    assert _same_bits(a1, a2)


# gae_lanes with next_values (float32, terminations and truncations both given)
# runs rows 8 at a time the same way, with the pair kernel's bits.


def _next_case(R, T, seed):
    rng, r, v, term = _data(R, T, seed=seed, p=0.05)
    nv = rng.standard_normal((R, T)).astype(np.float32)
    trunc = rng.random((R, T)) < 0.05
    return rng, r, v, dict(next_values=nv, terminated=term, truncated=trunc)


@pytest.mark.parametrize("T", LANE_LENGTHS)
@pytest.mark.parametrize("R", LANE_ROWS)
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
def test_lanes_next_kernel_gives_the_pair_kernels_bits(build_spy, monkeypatch, R, T, decay):
    rng, r, v, kw = _next_case(R, T, seed=R * 1000 + T + 7)
    kw.update(gamma=0.99, lam=0.95) if decay == "f32-state" else kw.update(gamma=0.999, lam=0.999)
    kw["last_advantage"] = rng.standard_normal(R).astype(np.float32)
    build_spy.clear()
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, **kw)
    state = "f32" if decay == "f32-state" else "f64"
    want_calls = [("gae_lanes", state)] + ([("gae_rows_fused", state)] if R % 8 else [])
    assert build_spy[:len(want_calls)] == want_calls
    assert _same_bits(got, pairs)
    ref = gt.gae(r, v, **kw)
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


@pytest.mark.parametrize("case", ["reversed-rows", "strided-out", "steps-strided-flags", "no-truncations"])
def test_lanes_next_kernel_views_and_fallbacks(build_spy, monkeypatch, case):
    # Rows addressed by their stride; flags not contiguous along time, or a missing
    # flag array, take the pair kernel (same bits either way).
    rng, r, v, kw = _next_case(19, 203, seed=11)
    kw.update(gamma=0.99, lam=0.95)
    lanes = True
    if case == "reversed-rows":
        r, v = r[::-1], v[::-1]
        kw.update({k: x[::-1] for k, x in kw.items() if k in ("next_values", "terminated", "truncated")})
    elif case == "strided-out":
        outs = (np.full((19, 300), np.nan, np.float32), np.full((19, 300), np.nan, np.float32))
        kw["out"] = (outs[0][:, 50:253], outs[1][:, 50:253])
    elif case == "steps-strided-flags":
        wide = np.zeros((19, 406), bool)
        wide[:, ::2] = kw["truncated"]
        kw["truncated"] = wide[:, ::2]
        lanes = False
    else:
        del kw["truncated"]
        lanes = False
    build_spy.clear()
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, **kw)
    assert (build_spy[0][0] == "gae_lanes") is lanes
    assert _same_bits(got, pairs)
    ref = gt.gae(r, v, **{k: x for k, x in kw.items() if k != "out"})
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5
    if case == "strided-out":
        assert got[0] is kw["out"][0] and np.all(np.isnan(outs[0][:, :50])) and np.all(np.isnan(outs[0][:, 253:]))


# gae_lanes with a mask (float32, with or without terminations) likewise.


def _mask_case(R, T, seed):
    # Prompt-like prefixes masked out, plus scattered masked steps.
    rng, r, v, d = _data(R, T, seed=seed, p=0.05)
    m = rng.random((R, T)) > 0.1
    m[:, : T // 4] = False
    return rng, r, v, d, m


@pytest.mark.parametrize("T", LANE_LENGTHS)
@pytest.mark.parametrize("R", LANE_ROWS)
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
def test_lanes_mask_kernel_gives_the_pair_kernels_bits(build_spy, monkeypatch, R, T, decay):
    rng, r, v, d, m = _mask_case(R, T, seed=R * 1000 + T + 13)
    gamma, lam = (0.99, 0.95) if decay == "f32-state" else (0.999, 0.999)
    last = rng.standard_normal(R).astype(np.float32)
    carry = rng.standard_normal(R).astype(np.float32)
    state = "f32" if decay == "f32-state" else "f64"
    for dones in (d, None):
        kw = dict(gamma=gamma, lam=lam, dones=dones, mask=m, last_value=last, last_advantage=carry)
        build_spy.clear()
        got, pairs = _lanes_and_pairs(monkeypatch, r, v, **kw)
        want_calls = [("gae_lanes", state)] + ([("gae_rows_fused", state)] if R % 8 else [])
        assert build_spy[:len(want_calls)] == want_calls
        assert _same_bits(got, pairs)
        ref = gt.gae(r, v, **kw)
        assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


def test_lanes_mask_kernel_views_nan_and_threads(build_spy, monkeypatch):
    # Reversed rows (addressed by their stride); a mask not contiguous along time
    # takes the pair kernel; NaN and inf at masked steps and past an episode's end
    # stay there; one thread gives the bits of two.
    rng, r, v, d, m = _mask_case(19, 16 * 12 + 5, seed=23)
    got, pairs = _lanes_and_pairs(monkeypatch, r[::-1], v[::-1], gamma=0.99, lam=0.95, dones=d[::-1], mask=m[::-1])
    assert _same_bits(got, pairs)
    wide = np.zeros((19, 2 * m.shape[1]), bool)
    wide[:, ::2] = m
    build_spy.clear()
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, gamma=0.99, lam=0.95, dones=d, mask=wide[:, ::2])
    assert build_spy[0][0] != "gae_lanes" and _same_bits(got, pairs)

    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    r2, v2, d2 = r.copy(), v.copy(), np.zeros_like(d)
    m = m.copy()
    m[:, 120] = True  # a done at a masked step is not a step at all
    d2[:, 120] = True
    r2[~m] = np.nan
    v2[~m] = np.inf
    r2[:, 121:140] = np.nan
    adv, ret = gaescan.gae(r2, v2, gamma=0.99, lam=0.95, dones=d2, mask=m, backend="numba")
    assert np.all(adv[~m] == 0) and np.all(ret[~m] == 0)
    assert np.all(np.isfinite(adv[:, :121])) and np.all(np.isfinite(ret[:, :121]))
    ref = gt.gae(r2[:, :121], v2[:, :121], gamma=0.99, lam=0.95, dones=d2[:, :121], mask=m[:, :121])
    assert gt.assert_close(adv[:, :121], ref[0]) <= 2e-5

    a1, a2 = one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.999, lam=0.99, dones=d, mask=m, backend="numba"))
    assert _same_bits(a1, a2)


def test_lanes_next_kernel_nan_stays_in_its_episode(monkeypatch):
    # A NaN past a termination or a truncation never reaches the steps before it;
    # a NaN next value at a terminated step is not read into its advantage.
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    _, r, v, kw = _next_case(16, 16 * 20 + 5, seed=3)
    term = np.zeros(r.shape, bool)
    trunc = np.zeros(r.shape, bool)
    term[:8, 150] = True
    trunc[8:, 150] = True
    kw.update(terminated=term, truncated=trunc)
    r[:, 151:170] = np.nan
    v[:, 151:170] = np.nan
    kw["next_values"][:8, 150] = np.nan
    kw["next_values"][:, 151:170] = np.nan
    adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw)
    assert np.all(np.isfinite(adv[:, :151])) and np.all(np.isfinite(ret[:, :151]))
    cut = {k: x[:, :151] for k, x in kw.items()}
    ref = gt.gae(r[:, :151], v[:, :151], gamma=0.99, lam=0.95, **cut)
    assert gt.assert_close(adv[:, :151], ref[0]) <= 2e-5


def test_lanes_next_kernel_is_thread_count_independent(monkeypatch):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    _, r, v, kw = _next_case(40, 1000 + 3, seed=5)
    a1, a2 = one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.999, lam=0.99, backend="numba", **kw))
    assert _same_bits(a1, a2)


@pytest.mark.slow
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (float(np.float32(0.9999999)), float(np.float32(0.9999999)))])
def test_lanes_kernel_long_rows(monkeypatch, gamma, lam):
    # 2^17 + 3 steps, and γ, λ just below 1 in float32 (the float64 state).
    rng, r, v, d = _data(9, (1 << 17) + 3, seed=17, p=0.001)
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, gamma=gamma, lam=lam, dones=d)
    assert _same_bits(got, pairs)
    ref = gt.gae(r, v, gamma=gamma, lam=lam, dones=d)
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (float(np.float32(0.9999999)), float(np.float32(0.9999999)))])
def test_lanes_next_kernel_long_rows(monkeypatch, gamma, lam):
    # 2^17 + 3 steps with next_values and both flags, γ and λ up to just below 1.
    _, r, v, kw = _next_case(9, (1 << 17) + 3, seed=19)
    kw["terminated"] &= np.random.default_rng(1).random(r.shape) < 0.02
    kw["truncated"] &= np.random.default_rng(2).random(r.shape) < 0.02
    got, pairs = _lanes_and_pairs(monkeypatch, r, v, gamma=gamma, lam=lam, **kw)
    assert _same_bits(got, pairs)
    ref = gt.gae(r, v, gamma=gamma, lam=lam, **kw)
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


# gae_packed_lanes: packed float32 sequences, eight at a time in SIMD lanes.
# Each sequence's results are the bits of the pair kernel on that sequence as
# a row, whatever the groups, lanes and order.

PACKED_CASES = ["plain", "dones", "mask", "mask+dones", "next"]


def _packed_case(case, lengths, seed):
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    N, S = int(cu[-1]), len(lengths)
    r, v = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    kw = dict(cu_seqlens=cu, last_advantage=rng.standard_normal(S).astype(np.float32))
    if case == "next":
        kw.update(next_values=rng.standard_normal(N).astype(np.float32), terminated=rng.random(N) < 0.03,
                  truncated=rng.random(N) < 0.03)
    else:
        kw["last_value"] = rng.standard_normal(S).astype(np.float32)
    if "dones" in case:
        kw["dones"] = rng.random(N) < 0.03
    if "mask" in case:
        kw["mask"] = rng.random(N) < 0.8
    return r, v, kw


def _per_sequence(r, v, gamma, lam, kw):
    """Each sequence as a row of its own, through the pair kernel."""
    cu = kw["cu_seqlens"]
    adv, ret = np.full_like(r, np.nan), np.full_like(r, np.nan)
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        if lo == hi:
            continue
        one = {k: (x[lo:hi][None] if x.shape == r.shape else float(x[s])) for k, x in kw.items()
               if k != "cu_seqlens"}
        a, b = gaescan.gae(r[lo:hi][None], v[lo:hi][None], gamma=gamma, lam=lam, backend="numba", **one)
        adv[lo:hi], ret[lo:hi] = a[0], b[0]
    return adv, ret


def _packed_lengths(rng, S):
    # every length around the 16-step block, empty sequences, and longer ones
    return rng.choice(LANE_LENGTHS + [0, 0, 100, 257, 400, 1000], size=S)


@pytest.mark.parametrize("case", PACKED_CASES)
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
def test_packed_lanes_give_each_sequences_bits(build_spy, monkeypatch, case, decay):
    gamma, lam = (0.99, 0.95) if decay == "f32-state" else (0.999, 0.999)
    for S, seed in ((8, 1), (45, 2), (130, 3)):
        r, v, kw = _packed_case(case, _packed_lengths(np.random.default_rng(seed), S), seed)
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
        monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
        monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
        build_spy.clear()
        got = gaescan.gae(r, v, gamma=gamma, lam=lam, backend="numba", **kw)
        assert build_spy == [("gae_packed_lanes", "f32" if decay == "f32-state" else "f64")]
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
        assert _same_bits(got, _per_sequence(r, v, gamma, lam, kw))
        ref = gt.gae(r, v, gamma=gamma, lam=lam, **kw)
        assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


def test_packed_lanes_split_changes_no_bit(monkeypatch):
    # one group of lanes (one thread) or several: other sequences per lane, same bits
    # (γλ here takes the float64 state, the plain call below)
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
    monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
    rng = np.random.default_rng(5)
    r, v, kw = _packed_case("dones", rng.integers(0, 300, size=77), 5)
    a1, a2 = one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.99999, lam=0.999, backend="numba", **kw))
    assert _same_bits(a1, a2)
    # three groups, one group in a random order, and blocks that start at
    # other steps (``phase``)
    S = len(kw["cu_seqlens"]) - 1
    for (order, groups), phase in [(numba_cpu._packed_order(kw["cu_seqlens"], 3), 0),
                                   ((rng.permutation(S), np.array([0, S])), 5),
                                   (numba_cpu._packed_order(kw["cu_seqlens"], 9), 15)]:
        got = np.empty_like(r), np.empty_like(r)
        cpu.gae_packed_lanes(r[None], v[None], v[None], False, kw["dones"][None].view(np.uint8), True,
                             numba_cpu._NO_FLAGS, numba_cpu._NO_FLAGS, False, np.full(1, 0.99999, np.float32),
                             np.full(1, 0.999, np.float32), kw["last_value"], kw["last_advantage"],
                             kw["cu_seqlens"], order.astype(np.int64), groups.astype(np.int64), phase, False,
                             got[0][None], got[1][None])
        assert _same_bits(a1, got)


@pytest.mark.parametrize("S,groups", [(8, 1), (9, 1), (16, 2), (100, 2), (1000, 16)])
def test_packed_lanes_order(S, groups):
    # groups of consecutive sequences, at least 8 each, about equal steps;
    # within each, the longest first
    rng = np.random.default_rng(S)
    lengths = rng.integers(0, 500, size=S)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    order, bounds = numba_cpu._packed_order(cu, groups)
    assert order.dtype == bounds.dtype == np.int64
    assert len(bounds) == groups + 1 and bounds[0] == 0 and bounds[-1] == S and np.all(np.diff(bounds) >= 8)
    assert np.array_equal(np.sort(order), np.arange(S))
    for u in range(groups):
        mine = order[bounds[u]:bounds[u + 1]]
        assert np.array_equal(np.sort(mine), np.arange(bounds[u], bounds[u + 1]))
        assert np.all(np.diff(lengths[mine]) <= 0)
    if S >= 32 * groups:
        steps = np.diff(cu[bounds])
        assert np.all(np.abs(steps - cu[-1] / groups) <= 2 * lengths.max())


def test_packed_lanes_nan_stays_in_its_sequence(monkeypatch):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
    monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
    lengths = np.array([70, 33, 64, 17, 90, 48, 16, 81, 40, 55])
    r, v, kw = _packed_case("dones", lengths, 9)
    cu = kw["cu_seqlens"]
    clean = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw)
    r, v = r.copy(), v.copy()
    r[cu[4]:cu[5]] = np.nan        # a whole sequence
    v[cu[7]] = np.inf              # the first step of another
    got = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw)
    keep = np.ones(len(r), bool)
    keep[cu[4]:cu[5]] = False
    keep[cu[7]] = False
    for x, y in zip(got, clean, strict=True):
        assert np.array_equal(x[keep], y[keep])


@pytest.mark.parametrize("why", ["per-step-gamma", "short", "few", "strided", "next-no-trunc",
                                 "next+mask", "skewed"])
def test_packed_lanes_fallbacks(build_spy, monkeypatch, why):
    # calls the packed-lanes kernel does not take run the general kernel
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    if why != "short":
        monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
        monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
    rng = np.random.default_rng(11)
    lengths = rng.integers(20, 60, size=3 if why == "few" else 20)
    r, v, kw = _packed_case("next" if why.startswith("next") else "plain", lengths, 11)
    gamma = 0.99
    if why == "per-step-gamma":
        gamma = np.full(r.shape, 0.99, np.float32)
    elif why == "strided":
        r = np.repeat(r, 2)[::2]
    elif why == "next-no-trunc":
        del kw["truncated"]
    elif why == "next+mask":
        kw["mask"] = rng.random(r.shape) < 0.9
    elif why == "skewed":
        # one sequence of more than PACKED_MAX_SEQUENCE_SHARE of the steps (the default)
        monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1 / 16)
        r, v, kw = _packed_case("plain", np.append(lengths, 8 * int(lengths.sum())), 11)
    got = gaescan.gae(r, v, gamma=gamma, lam=0.95, backend="numba", **kw)
    assert [k for k, _ in build_spy] == ["gae_rows"]
    ref = gt.gae(r, v, gamma=gamma, lam=0.95, **kw)
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


# gae_packed_pairs: packed float64 sequences with scalar γ and λ, two at a time.


def _f64(r, v, kw):
    return r.astype(np.float64), v.astype(np.float64), {
        k: x.astype(np.float64) if x.dtype == np.float32 else x for k, x in kw.items()}


@pytest.mark.parametrize("case", PACKED_CASES + ["next-no-trunc"])
def test_packed_pairs_give_each_sequences_bits(build_spy, case):
    for S, seed in ((1, 1), (2, 4), (9, 2), (130, 3)):
        r, v, kw = _f64(*_packed_case(case.removesuffix("-no-trunc"), _packed_lengths(np.random.default_rng(seed), S),
                                      seed))
        if case == "next-no-trunc":
            del kw["truncated"]
        build_spy.clear()
        got = gaescan.gae(r, v, gamma=0.999, lam=0.95, backend="numba", **kw)
        assert build_spy == [("gae_packed_pairs", "f64")]
        assert all(np.array_equal(x.view(np.uint64), y.view(np.uint64))
                   for x, y in zip(got, _per_sequence(r, v, 0.999, 0.95, kw), strict=True))
        ref = gt.gae(r, v, gamma=0.999, lam=0.95, **kw)
        assert gt.assert_close(got[0], ref[0]) <= 1e-12 and gt.assert_close(got[1], ref[1]) <= 1e-12


def test_packed_pairs_thread_count_and_nan(monkeypatch):
    # 2^17 + 3 steps in sequences of every length around a pair's ends: the
    # same bits on one thread and on all; a NaN stays in its sequence
    rng = np.random.default_rng(21)
    lengths = np.append(rng.choice(LANE_LENGTHS + [0, 1000, 4099], size=200), 0)
    lengths[-1] = (1 << 17) + 3 - lengths.sum()
    r, v, kw = _f64(*_packed_case("dones", lengths, 21))
    cu = kw["cu_seqlens"]
    a1, a2 = one_thread_and_all(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw))
    assert all(np.array_equal(x.view(np.uint64), y.view(np.uint64)) for x, y in zip(a1, a2, strict=True))
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, **kw)
    assert gt.assert_close(a1[0], ref[0]) <= 1e-12 and gt.assert_close(a1[1], ref[1]) <= 1e-12
    s = int(np.argmax(lengths > 20))
    r = r.copy()
    r[cu[s] + 5] = np.nan
    got = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw)
    keep = np.ones(len(r), bool)
    keep[cu[s]:cu[s] + 6] = False
    for x, y in zip(got, a1, strict=True):
        assert np.array_equal(x[keep], y[keep]) and np.isnan(x[cu[s] + 5])


@pytest.mark.parametrize("why", ["per-step-gamma", "zero-lam", "next+mask"])
def test_packed_pairs_fallbacks(build_spy, why):
    # float64 packed calls the pairs kernel does not take run the general kernel
    r, v, kw = _f64(*_packed_case("next" if why == "next+mask" else "dones",
                                  np.random.default_rng(12).integers(20, 60, size=20), 12))
    gamma, lam = 0.99, 0.95
    if why == "per-step-gamma":
        gamma = np.full(r.shape, 0.99)
    elif why == "zero-lam":
        lam = 0.0
    else:
        kw["mask"] = np.random.default_rng(12).random(r.shape) < 0.9
    got = gaescan.gae(r, v, gamma=gamma, lam=lam, backend="numba", **kw)
    assert [k for k, _ in build_spy] == ["gae_rows"]
    ref = gt.gae(r, v, gamma=gamma, lam=lam, **kw)
    assert gt.assert_close(got[0], ref[0]) <= 1e-12 and gt.assert_close(got[1], ref[1]) <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (float(np.float32(0.9999999)), float(np.float32(0.9999999)))])
def test_packed_lanes_long_sequences(build_spy, monkeypatch, gamma, lam):
    # 2^17 + 3 steps in 11 sequences, γ and λ up to just below 1 (the float64 state)
    lengths = np.array([1 << 14] * 5 + [5, 16, 31, 1 << 15, 0])
    lengths = np.append(lengths, (1 << 17) + 3 - lengths.sum())
    r, v, kw = _packed_case("dones", lengths, 13)
    kw["dones"] &= np.random.default_rng(3).random(r.shape) < 0.02
    monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
    build_spy.clear()
    got = gaescan.gae(r, v, gamma=gamma, lam=lam, backend="numba", **kw)
    assert [k for k, _ in build_spy] == ["gae_packed_lanes"]
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
    assert _same_bits(got, _per_sequence(r, v, gamma, lam, kw))
    ref = gt.gae(r, v, gamma=gamma, lam=lam, **kw)
    assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


# Non-temporal stores (numba_cpu.STREAM_MIN_BYTES and up, outputs whose rows
# start their 64-byte lines at one step): the same bits as ordinary stores.


@pytest.mark.parametrize("case", ["plain", "dones", "mask", "next"])
@pytest.mark.parametrize("T,offset", [(131, 0), (131, 5), (20, 7), (16, 3), (61, 15)])
def test_streaming_rows_give_the_same_bits(monkeypatch, case, T, offset):
    R = 17
    rng, r, v, d = _data(R, T, seed=T + offset, p=0.05)
    kw = dict(gamma=0.99, lam=0.95)
    if case == "dones":
        kw["dones"] = d
    elif case == "mask":
        kw.update(dones=d, mask=rng.random((R, T)) < 0.8)
    elif case == "next":
        kw.update(next_values=rng.standard_normal((R, T)).astype(np.float32), terminated=d,
                  truncated=rng.random((R, T)) < 0.05)
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    plain = gaescan.gae(r, v, backend="numba", **kw)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    out = aligned_rows_out(R, T, T + (-T) % 16 + 16, offset)
    assert numba_cpu._stream(*out) == ((16 - offset) % 16, True)
    got = gaescan.gae(r, v, backend="numba", out=tuple(out), **kw)
    assert _same_bits(got, plain)


@pytest.mark.parametrize("case", PACKED_CASES)
@pytest.mark.parametrize("offset", [0, 9])
def test_streaming_packed_gives_the_same_bits(monkeypatch, case, offset):
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
    monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)
    r, v, kw = _packed_case(case, _packed_lengths(np.random.default_rng(offset), 60), offset)
    plain = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", **kw)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    out = [x[0] for x in aligned_rows_out(1, len(r), len(r), offset)]
    assert numba_cpu._stream(*out)[1]
    got = gaescan.gae(r, v, gamma=0.99, lam=0.95, backend="numba", out=tuple(out), **kw)
    assert _same_bits(got, plain)


def test_streaming_needs_aligned_rows(monkeypatch):
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    a, b = aligned_rows_out(4, 40, 48, 2)
    assert numba_cpu._stream(a, b) == (14, True)
    assert numba_cpu._stream(*aligned_rows_out(4, 40, 44, 2)) == (14, False)    # rows 176 bytes apart
    c, _ = aligned_rows_out(4, 40, 48, 3)
    assert numba_cpu._stream(a, c) == (14, False)                            # lines start at other steps
    assert numba_cpu._stream(a[:1], c[:1]) == (14, False)
    assert numba_cpu._stream(a[:, 4:], b[:, 4:]) == (10, True)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", a.nbytes + 1)
    assert numba_cpu._stream(a, b) == (14, False)                            # small outputs


# Time-major GAE with non-temporal stores (gae_timemajor_lanes: float32, plain,
# with terminations, or next values with both flags; outputs of STREAM_MIN_BYTES
# and up whose rows start their 32-byte vectors at one column): the bits of
# gae_timemajor and gae_timemajor_next.


def _aligned_tm_out(T, B, offset):
    """Two C-contiguous float32 ``(T, B)`` arrays whose column 0 is ``offset``
    items past a 64-byte boundary."""
    outs = []
    for _ in range(2):
        buf = np.full(T * B + 32, np.nan, np.float32)
        skip = (-buf.__array_interface__["data"][0] % 64) // 4 + offset
        outs.append(buf[skip:skip + T * B].reshape(T, B))
    return outs


@pytest.mark.parametrize("case", ["plain", "dones", "next"])
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
@pytest.mark.parametrize("T,B,offset", [(2, 8, 0), (37, 16, 3), (130, 72, 5), (17, 8, 7), (64, 200, 1),
                                        (40, 264, 12), (9, 136, 9)])
def test_time_major_lanes_give_the_same_bits(build_spy, monkeypatch, case, decay, T, B, offset):
    rng, r, v, d = _data(T, B, seed=T * 100 + B + offset, p=0.05)
    r[T // 2, B // 3] = np.nan  # stays in its episode: the bits say so, as in gae_timemajor
    gamma, lam = (0.99, 0.95) if decay == "f32-state" else (0.999, 0.999)
    kw = dict(gamma=gamma, lam=lam, axis=0, backend="numba", last_advantage=rng.standard_normal(B).astype(np.float32))
    if case == "next":
        kw.update(next_values=rng.standard_normal((T, B)).astype(np.float32), terminated=d,
                  truncated=rng.random((T, B)) < 0.05)
    else:
        kw.update(dones=d if case == "dones" else None, last_value=rng.standard_normal(B).astype(np.float32))
    build_spy.clear()
    want = gaescan.gae(r, v, **kw)
    assert [k for k, _ in build_spy] == ["gae_timemajor_next" if case == "next" else "gae_timemajor"]
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    out = _aligned_tm_out(T, B, offset)
    assert numba_cpu._stream_cols(out[0].T, out[1].T) == ((16 - offset) % 16, B % 8 == 0)
    if B % 8:
        return
    build_spy.clear()
    many, one = one_thread_and_all(lambda: [x.copy() for x in gaescan.gae(r, v, out=tuple(out), **kw)])
    state = "f32" if decay == "f32-state" else "f64"
    assert build_spy == [("gae_timemajor_lanes", state)] * 2
    assert _same_bits(many, want) and _same_bits(one, want)


def test_time_major_streaming_needs_aligned_rows(monkeypatch):
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    a, b = _aligned_tm_out(4, 40, 2)
    assert numba_cpu._stream_cols(a.T, b.T) == (14, True)
    c, _ = _aligned_tm_out(4, 40, 3)
    assert numba_cpu._stream_cols(a.T, c.T) == (14, False)                 # vectors start at other columns
    c, _ = _aligned_tm_out(4, 40, 10)
    assert numba_cpu._stream_cols(a.T, c.T) == (14, False)                 # lines start at other columns
    a, b = _aligned_tm_out(4, 44, 2)
    assert numba_cpu._stream_cols(a.T, b.T) == (14, False)                 # rows 176 bytes long
    a, b = _aligned_tm_out(4, 40, 2)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", a.nbytes + 1)
    assert numba_cpu._stream_cols(a.T, b.T) == (14, False)                 # small outputs


def test_time_major_next_values_stream_with_both_flags_only(build_spy, monkeypatch):
    # without truncations (or terminations) the flags read are zero-stride views: no lanes
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    rng, r, v, d = _data(20, 16, seed=3, p=0.1)
    nv = rng.standard_normal((20, 16)).astype(np.float32)
    out = _aligned_tm_out(20, 16, 0)
    for flags, kernel in ((dict(terminated=d), "gae_timemajor_next"), (dict(truncated=d), "gae_timemajor_next"),
                          (dict(terminated=d, truncated=~d), "gae_timemajor_lanes")):
        build_spy.clear()
        got = gaescan.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, axis=0, backend="numba", out=tuple(out), **flags)
        assert [k for k, _ in build_spy] == [kernel]
        ref = gt.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, axis=0, **flags)
        assert gt.assert_close(got[0], ref[0]) <= 2e-5 and gt.assert_close(got[1], ref[1]) <= 2e-5


# Time-major discounted returns and linear scans with non-temporal stores
# (returns_timemajor_lanes, scan_timemajor_lanes): the bits of returns_tm and scan_tm.


@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
@pytest.mark.parametrize("T,B,offset", [(2, 8, 0), (37, 16, 3), (130, 72, 5), (64, 200, 1)])
def test_time_major_returns_and_scans_stream_with_the_same_bits(build_spy, monkeypatch, decay, T, B, offset):
    rng, r, v, d = _data(T, B, seed=T * 10 + B + offset, p=0.05)
    r[T // 2, B // 3] = np.nan  # stays in its episode (returns) or until the next a == 0 (scans)
    gamma = 0.99 if decay == "f32-state" else 0.9999
    a = rng.uniform(0.5, 1.0, (T, B)).astype(np.float32)
    a[rng.random((T, B)) < 0.05] = 0
    init = rng.standard_normal(B).astype(np.float32)
    calls = {
        "returns dones": (lambda **o: gaescan.discounted_returns(r, gamma=gamma, dones=d, last_value=init, axis=0,
                                                                 backend="numba", **o), "returns"),
        "returns plain": (lambda **o: gaescan.discounted_returns(r, gamma=gamma, last_value=init, axis=0,
                                                                 backend="numba", **o), "returns"),
        "scan reverse": (lambda **o: gaescan.linear_scan(a, r, reverse=True, initial=init, axis=0, backend="numba",
                                                         **o), "scan"),
        "scan forward": (lambda **o: gaescan.linear_scan(a, r, initial=init, axis=0, backend="numba", **o), "scan"),
    }
    for name, (call, kind) in calls.items():
        monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 1 << 62)
        build_spy.clear()
        want = call()
        assert [k for k, _ in build_spy] == [f"{kind}_tm"], name
        monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
        out = _aligned_tm_out(T, B, offset)[0]
        build_spy.clear()
        many, one = one_thread_and_all(lambda call=call, out=out: call(out=out).copy())
        assert [k for k, _ in build_spy] == [f"{kind}_timemajor_lanes"] * 2, name
        assert _same_bits([many], [want]) and _same_bits([one], [want]), name


def test_time_major_returns_and_scans_stream_only_where_they_may(build_spy, monkeypatch):
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    rng, r, v, d = _data(20, 16, seed=5, p=0.1)
    out = _aligned_tm_out(20, 16, 0)[0]
    g = np.full((20, 16), 0.9, np.float32)
    for call, kernel in ((lambda: gaescan.discounted_returns(r, gamma=g, axis=0, out=out), "returns_tm"),  # γ per step
                         (lambda: gaescan.discounted_returns(r, gamma=0.9, mask=~d, axis=0, out=out), "returns_tm"),
                         (lambda: gaescan.linear_scan(0.9, r, axis=0, out=out), "scan_tm"),  # a zero-stride view
                         (lambda: gaescan.discounted_returns(r, gamma=0.9, dones=d, axis=0, out=out),
                          "returns_timemajor_lanes")):
        build_spy.clear()
        call()
        assert [k for k, _ in build_spy] == [kernel]


def test_time_major_returns_and_scans_need_time_major_outputs(build_spy, monkeypatch):
    # Inputs in time-major memory, the output not: an ``out`` of the other
    # layout, or rows given in Fortran order (whose outputs the call allocates
    # C-contiguous).  The lanes kernels write columns contiguous along the batch,
    # so these take the general kernels, which follow any strides.
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    rng, r, v, d = _data(40, 16, seed=7, p=0.1)
    a = rng.uniform(0.5, 1.0, (40, 16)).astype(np.float32)
    out = np.empty((16, 40), np.float32).T  # (T, B) in batch-major memory
    rf, df, af = (np.asfortranarray(x.T) for x in (r, d, a))  # (B, T) in time-major memory
    cases = [
        (lambda: gaescan.discounted_returns(r, gamma=0.9, dones=d, axis=0, out=out),
         gt.discounted_returns(r, gamma=0.9, dones=d, axis=0), "returns_tm"),
        (lambda: gaescan.discounted_returns(rf, gamma=0.9, dones=df), gt.discounted_returns(rf, gamma=0.9, dones=df),
         "returns_tm"),
        (lambda: gaescan.linear_scan(a, r, reverse=True, axis=0, out=out), gt.linear_scan(a, r, reverse=True, axis=0),
         "scan_tm"),
        (lambda: gaescan.linear_scan(af, rf), gt.linear_scan(af, rf), "scan_tm"),
    ]
    for call, ref, kernel in cases:
        build_spy.clear()
        got = call()
        assert [k for k, _ in build_spy] == [kernel]
        gt.assert_close(got, ref, dtype=np.float32)


@pytest.mark.parametrize("units", [1, 2, 5])
@pytest.mark.parametrize("R,phase", [(3, 5), (8, 7), (13, 0), (9, 1), (12, 13), (24, 10), (200, 9), (520, 4)])
def test_time_major_lanes_kernels_take_any_width_and_phase(R, phase, units):
    # called directly, with ordinary stores: narrow batches and phases past the
    # last column run one column at a time, with the same bits; so does any
    # split of the columns into units (one per thread)
    rng, r, v, d = _data(23, R, seed=R + phase, p=0.1)
    a = rng.uniform(0.5, 1.0, (23, R)).astype(np.float32)
    z, g, lam = np.zeros(R, np.float32), np.full(R, 0.99, np.float32), np.full(R, 0.9, np.float32)
    d8 = d.view(np.uint8)
    want, got = [np.empty_like(r) for _ in range(2)], [np.empty_like(r) for _ in range(2)]
    cpu.gae_timemajor(r, v, d8, True, g, lam, z, z, *want)
    cpu.gae_timemajor_lanes(r, v, r, False, d8, True, d8, g, lam, z, z, phase, False, units, *got)
    assert _same_bits(got, want)
    cpu.scan_tm(a, r, True, z, want[0])
    cpu.scan_timemajor_lanes(a, r, True, z, phase, False, units, got[0])
    cpu.returns_tm(r, np.broadcast_to(g, (23, R)), d8, np.ones((23, R), np.uint8), z, np.float32(0), want[1])
    cpu.returns_timemajor_lanes(r, d8, True, g, z, phase, False, units, got[1])
    assert _same_bits(got, want)


# ------------------------------------------------ batch-major scans and returns in lanes
# linear_scan and discounted_returns on float32 rows contiguous along time, above
# SERIAL_MAX_STEPS, run rows 8 at a time (scan_lanes, returns_lanes) and the last
# R % 8 in pairs, with the pair kernels' bits: each case runs once through them
# (SERIAL_MAX_STEPS = 0) and once on the calling thread's pair kernels.


def _scan_and_returns_calls(R, T, seed, decay):
    rng, r, v, d = _data(R, T, seed=seed, p=0.05)
    r[R // 2, T // 2] = np.nan  # stays in its episode (returns) or until the next a == 0 (scans)
    a = rng.uniform(0.5, 1.0, (R, T)).astype(np.float32)
    a[rng.random((R, T)) < 0.05] = 0
    init = rng.standard_normal(R).astype(np.float32)
    gamma = 0.99 if decay == "f32-state" else 0.9999
    g_rows = rng.uniform(0.9, 0.99, (R, 1)).astype(np.float32) if decay == "f32-state" else gamma
    return {
        "returns dones": (lambda **o: gaescan.discounted_returns(r, gamma=gamma, dones=d, last_value=init,
                                                                 backend="numba", **o),
                          lambda: gt.discounted_returns(r, gamma=gamma, dones=d, last_value=init), "returns"),
        "returns plain, gamma per row": (
            lambda **o: gaescan.discounted_returns(r, gamma=g_rows, last_value=init, backend="numba", **o),
            lambda: gt.discounted_returns(r, gamma=g_rows, last_value=init), "returns"),
        "scan reverse": (lambda **o: gaescan.linear_scan(a, r, reverse=True, initial=init, backend="numba", **o),
                         lambda: gt.linear_scan(a, r, reverse=True, initial=init), "scan"),
        "scan forward": (lambda **o: gaescan.linear_scan(a, r, initial=init, backend="numba", **o),
                         lambda: gt.linear_scan(a, r, initial=init), "scan"),
    }


def _finite_close(got, ref):
    ok = np.isfinite(ref)
    assert np.array_equal(ok, np.isfinite(got))
    return gt.assert_close(got[ok], ref[ok])


@pytest.mark.parametrize("T", LANE_LENGTHS)
@pytest.mark.parametrize("R", LANE_ROWS)
@pytest.mark.parametrize("decay", ["f32-state", "f64-state"])
def test_scan_and_returns_lanes_give_the_pair_kernels_bits(build_spy, monkeypatch, R, T, decay):
    for name, (call, ref, kind) in _scan_and_returns_calls(R, T, R * 1000 + T, decay).items():
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
        pairs = call()
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
        build_spy.clear()
        got = call()
        pair = "scan_rows" if kind == "scan" else "returns_rows_fused"
        want = [f"{kind}_lanes"] + ([pair] if R % 8 else [])
        assert [k for k, _ in build_spy] == want, name
        state = {s for _, s in build_spy}
        if kind == "returns":
            assert state == ({"f64"} if decay == "f64-state" else {"f32"}), name
        else:  # a per-step coefficient: a float64 state (float32 only where T == 1 and max |a| <= 0.99)
            assert len(state) == 1, name
        assert _same_bits([got], [pairs]), name
        assert _finite_close(got, ref()) <= 2e-5, name


@pytest.mark.parametrize("T,offset", [(131, 0), (131, 5), (20, 7), (16, 3), (61, 15)])
def test_scan_and_returns_lanes_stream_with_the_same_bits(build_spy, monkeypatch, T, offset):
    R = 17
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    for name, (call, _, kind) in _scan_and_returns_calls(R, T, T + offset, "f32-state").items():
        monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 1 << 62)
        want = call()
        monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
        out = aligned_rows_out(R, T, T + (-T) % 16 + 16, offset)[0]
        assert numba_cpu._stream(out, out) == ((16 - offset) % 16, True)
        build_spy.clear()
        many, one = one_thread_and_all(lambda call=call, out=out: call(out=out).copy())
        assert [k for k, _ in build_spy][::2] == [f"{kind}_lanes"] * 2, name
        assert _same_bits([many], [want]) and _same_bits([one], [want]), name


@pytest.mark.parametrize("view", ["reversed-rows", "wider-rows", "steps-strided", "scalar-a", "bool-view-dones"])
def test_scan_and_returns_lanes_views(build_spy, monkeypatch, view):
    # Rows addressed by their stride; arrays not contiguous along time (and a
    # scalar coefficient, a zero-stride view) take the pair kernels.
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
    rng, r, _, d = _data(19, 203, seed=11, p=0.03)
    a = rng.uniform(0.5, 1.0, r.shape).astype(np.float32)
    lanes = True
    if view == "reversed-rows":
        r, a, d = r[::-1], a[::-1], d[::-1]
    elif view == "wider-rows":
        wr = np.zeros((19, 260), np.float32)
        wr[:, 3:206] = r
        r = wr[:, 3:206]
    elif view == "steps-strided":
        wr = np.zeros((19, 406), np.float32)
        wr[:, ::2] = r
        r, lanes = wr[:, ::2], False
    elif view == "bool-view-dones":
        wd = np.zeros((19, 406), bool)
        wd[:, ::2] = d
        d = wd[:, ::2]
    build_spy.clear()
    ret = gaescan.discounted_returns(r, gamma=0.99, dones=d, backend="numba")
    want = ["returns_lanes", "returns_rows_fused"] if lanes and view != "bool-view-dones" else ["returns_rows_fused"]
    assert [k for k, _ in build_spy] == want
    assert gt.assert_close(ret, gt.discounted_returns(r, gamma=0.99, dones=d)) <= 2e-5
    build_spy.clear()
    coeff = 0.97 if view == "scalar-a" else a
    y = gaescan.linear_scan(coeff, r, reverse=True, backend="numba")
    assert [k for k, _ in build_spy] == (["scan_lanes", "scan_rows"] if lanes and view != "scalar-a"
                                         else ["scan_rows"])
    assert gt.assert_close(y, gt.linear_scan(coeff, r, reverse=True)) <= 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [float(np.nextafter(np.float32(1), np.float32(0))), 0.99], ids=repr)
def test_scan_and_returns_lanes_long_rows(monkeypatch, gamma):
    # 2^17 steps, γ up to the largest float32 below 1: within tolerance of the
    # float64 reference and the bits of the pair kernels.
    rng, r, _, d = _data(9, 1 << 17, seed=3, p=1e-5)
    a = np.full(r.shape, gamma, np.float32)
    for call, ref in ((lambda: gaescan.discounted_returns(r, gamma=gamma, dones=d, backend="numba"),
                       lambda: gt.discounted_returns(r, gamma=gamma, dones=d)),
                      (lambda: gaescan.linear_scan(a, r, reverse=True, backend="numba"),
                       lambda: gt.linear_scan(a, r, reverse=True))):
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
        got = call()
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
        assert _same_bits([got], [call()])
        assert gt.assert_close(got, ref()) <= 2e-5


# --------------------------------------------------------------------------- lanes shifted apart
# Lane q of every batch-major lanes kernel runs q·sk steps after lane 0
# (cpu._lane_span): sk grows with the row (0, 16, 32, up to 64 steps), and each
# lane runs the steps outside its blocks one row at a time.  The lengths below
# cross each skew; every kernel keeps the pair kernels' bits, streamed or not.

SKEW_LENGTHS = {3583: 0, 3584: 16, 3599: 16, 7168 + 5: 32, 14336 + 17: 64}


def test_lane_skew_grows_with_the_row():
    assert {T: cpu._lane_span.py_func(T, 0, False)[4] for T in SKEW_LENGTHS} == SKEW_LENGTHS
    for T in SKEW_LENGTHS:
        for phase in (0, 5, 15):
            h0, nb, tb, nt, sk = cpu._lane_span.py_func(T, phase, True)
            assert h0 == phase and nt and sk % 16 == 0
            # the last lane's blocks end inside the row; lane 0's start at h0
            assert tb + 7 * sk <= T and tb == h0 + 16 * nb and T - (tb + 7 * sk) < 16


@pytest.mark.parametrize("T", list(SKEW_LENGTHS))
@pytest.mark.parametrize("stream", [False, True])
def test_shifted_lanes_give_the_pair_kernels_bits(build_spy, monkeypatch, T, stream):
    R = 9
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)

    def outs(n):
        o = aligned_rows_out(R, T, T + (-T) % 16 + 16, 5)
        return tuple(o[:n]) if n > 1 else o[0]

    rng, r, v, d = _data(R, T, seed=T, p=0.002)
    _, _, _, nxt = _next_case(R, T, seed=T + 1)
    nxt["terminated"] &= rng.random((R, T)) < 0.05
    nxt["truncated"] &= rng.random((R, T)) < 0.05
    for kw in (dict(gamma=0.99, lam=0.95, dones=d), dict(gamma=0.999, lam=0.999),
               dict(gamma=0.99, lam=0.95, **nxt)):
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
        pairs = gaescan.gae(r, v, backend="numba", **kw)
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
        build_spy.clear()
        got = gaescan.gae(r, v, backend="numba", out=outs(2), **kw)
        assert build_spy[0][0] == "gae_lanes"
        assert _same_bits(got, pairs)
    for name, (call, ref, kind) in _scan_and_returns_calls(R, T, T, "f32-state").items():
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 1 << 62)
        pairs = call()
        monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", 0)
        build_spy.clear()
        got = call(out=outs(1))
        assert build_spy[0][0] == f"{kind}_lanes", name
        assert _same_bits([got], [pairs]), name
        assert _finite_close(got, ref()) <= 2e-5, name
