"""The CUDA backend's kernels, run in Numba's CUDA simulator on NumPy arrays.

Run with ``NUMBA_ENABLE_CUDASIM=1`` set in the environment *before* Python
starts (Numba reads it at import).  Tiles are shrunk (a few threads, 2-3 steps
per thread) so rows of a few dozen steps cross every thread, tile and
look-back chunk boundary; the simulator runs a few hundred steps per second
in barrier-heavy scans, so shapes stay tiny.

The references are ``gaescan.testing``'s float64 loops, independent of the kernels.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

pytestmark = pytest.mark.cudasim

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
    pytest.skip("set NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in the simulator",
                allow_module_level=True)

pytest.importorskip("numba")
from conftest import cuda_settings  # noqa: E402
from numba import cuda  # noqa: E402  (a module global: the simulator swaps it in kernels)

import gaescan.testing as gt  # noqa: E402
from gaescan._problem import GAEProblem, ReturnsProblem, Rows, ScanProblem  # noqa: E402
from gaescan.backends import cuda as cb  # noqa: E402

# Tiny geometries: (threads per block, steps per thread, rows_min_blocks).
ROWS = dict(threads=8, k=2, k_f64=3, k_time_major=2, rows_time_major=4, rows_min_blocks=1)
# The general look-back (the fast one, the default where it applies, is a variant below).
LOOKBACK = dict(threads=8, k=3, k_f64=2, k_time_major=3, rows_time_major=4, rows_min_blocks=10**9,
                fast_lookback=False)
# Look-back where only every 16th tile publishes its state: later tiles walk past
# many published maps (windows longer than the block) and apply them in order.
LONGWALK = dict(LOOKBACK, k=2, unpublished_tiles=True)
MODES = pytest.mark.parametrize("tun", [ROWS, LOOKBACK, LONGWALK], ids=["rows", "lookback", "longwalk"])


# --------------------------------------------------------------------------- references
# The kernels see (R, T) rows, time last; with ``cu`` the packed sequences are row 0.


def _packed(x, cu):
    return x if cu is None or x is None or np.ndim(x) == 0 else np.asarray(x).reshape(-1)


def _as_rows(y, shape):
    return np.asarray(y).reshape(shape)


def gae_oracle(r, v, g, lam, nv=None, term=None, trunc=None, mask=None, lv=0.0, cu=None):
    """``gaescan.testing.gae`` on (R, T) rows, ``(advantages, returns)``."""
    adv, ret = gt.gae(*(_packed(x, cu) for x in (r, v)), gamma=_packed(g, cu), lam=_packed(lam, cu),
                      next_values=_packed(nv, cu), terminated=_packed(term, cu), truncated=_packed(trunc, cu),
                      mask=_packed(mask, cu), last_value=None if nv is not None else lv, cu_seqlens=cu)
    return _as_rows(adv, r.shape), _as_rows(ret, r.shape)


def returns_oracle(r, g, dones=None, mask=None, lv=0.0, cu=None):
    """``gaescan.testing.discounted_returns`` on (R, T) rows."""
    return _as_rows(gt.discounted_returns(_packed(r, cu), gamma=_packed(g, cu), dones=_packed(dones, cu),
                                          mask=_packed(mask, cu), last_value=lv, cu_seqlens=cu), r.shape)


def scan_oracle(a, b, reverse, initial=0.0):
    """``gaescan.testing.linear_scan`` on (R, T) rows."""
    return gt.linear_scan(a, b, reverse=reverse, initial=initial)


# --------------------------------------------------------------------------- helpers


def rows_of(dtype, R, T, cu=None):
    nseg = R if cu is None else len(cu) - 1
    return Rows(xp=np, dtype=np.dtype(dtype), R=R, T=T, cu_seqlens=cu, nseg=nseg)


def coeff(c, dtype):
    """As the validator hands coefficients over: a rounded float, or a view."""
    if np.isscalar(c):
        return float(np.dtype(dtype).type(c))
    return c


def close(got, want, dtype):
    gt.assert_close(got, want, dtype=dtype)


def run_gae(tun, dtype, r, v, g, lam, nv=None, term=None, trunc=None, mask=None, lv=0.0, cu=None):
    R, T = r.shape
    adv = np.full((R, T), np.nan, dtype=dtype)
    ret = np.full((R, T), np.nan, dtype=dtype)
    lvp = coeff(lv, dtype) if np.ndim(lv) == 0 else lv
    p = GAEProblem(rows=rows_of(dtype, R, T, cu), rewards=r, values=v, next_values=nv,
                   terminated=term, truncated=trunc, mask=mask, gamma=coeff(g, dtype),
                   lam=coeff(lam, dtype), last_value=lvp, advantages=adv, returns=ret)
    with cuda_settings(tun):
        cb.gae(p)
    return adv, ret


def rng_data(seed, R, T, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng, rng.standard_normal((R, T)).astype(dtype), rng.standard_normal((R, T)).astype(dtype)


# --------------------------------------------------------------------------- GAE


@MODES
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gae_dones_scalar(tun, dtype):
    rng, r, v = rng_data(0, 3, 37, dtype)
    d = rng.random((3, 37)) < 0.15
    adv, ret = run_gae(tun, dtype, r, v, 0.97, 0.9, term=d, lv=0.3)
    ea, er = gae_oracle(r, v, float(dtype(0.97)), float(dtype(0.9)), term=d, lv=float(dtype(0.3)))
    close(adv, ea, dtype)
    close(ret, er, dtype)


@MODES
def test_gae_mask_per_row_per_step_f16(tun):
    R, T = 3, 29
    rng = np.random.default_rng(1)
    r = rng.standard_normal((R, T)).astype(np.float16)
    v = rng.standard_normal((R, T)).astype(np.float16)
    d = (rng.random((R, T)) < 0.1).astype(np.int8)
    m = rng.random((R, T)) < 0.7
    m[1, :] = False  # a fully masked row
    m[2, -5:] = False  # a masked tail
    r[~m] = np.nan  # masked inputs are never read
    v[~m] = np.nan
    g = rng.uniform(0.8, 1.0, (R, T)).astype(np.float32)  # per step
    lam = np.broadcast_to(np.array([[0.9], [0.5], [1.0]], dtype=np.float32), (R, T))  # per row
    lv = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    adv, ret = run_gae(tun, np.float32, r, v, g, lam, term=d, mask=m, lv=lv)
    ea, er = gae_oracle(r.astype(np.float64), v.astype(np.float64), g, lam, term=d, mask=m, lv=lv)
    assert np.all(adv[~m] == 0) and np.all(ret[~m] == 0)
    close(adv, ea, np.float32)
    close(ret, er, np.float32)


@MODES
@pytest.mark.parametrize("flags", ["bool", "float"])
def test_gae_terminated_truncated_next_values(tun, flags):
    R, T = 2, 41
    rng, r, v = rng_data(2, R, T)
    nv = rng.standard_normal((R, T))
    term = rng.random((R, T)) < 0.08
    trunc = rng.random((R, T)) < 0.08
    m = rng.random((R, T)) < 0.85
    if flags == "float":
        term, trunc = term.astype(np.float32), trunc.astype(np.float64)
    adv, ret = run_gae(tun, np.float64, r, v, 0.99, 0.95, nv=nv, term=term, trunc=trunc, mask=m)
    ea, er = gae_oracle(r, v, 0.99, 0.95, nv=nv, term=term, trunc=trunc, mask=m)
    close(adv, ea, np.float64)
    close(ret, er, np.float64)


@MODES
def test_gae_truncated_only(tun):
    rng, r, v = rng_data(3, 2, 23)
    nv = rng.standard_normal((2, 23))
    trunc = rng.random((2, 23)) < 0.2
    adv, _ = run_gae(tun, np.float64, r, v, 0.9, 0.7, nv=nv, trunc=trunc)
    close(adv, gae_oracle(r, v, 0.9, 0.7, nv=nv, trunc=trunc)[0], np.float64)


@MODES
def test_gae_packed_segments(tun):
    # Empty segments (first, middle, last), a one-step segment, one longer than a tile.
    cu = np.array([0, 0, 3, 3, 4, 25, 31, 31, 44, 44], dtype=np.int64)
    N = int(cu[-1])
    rng, r, v = rng_data(4, 1, N)
    d = rng.random((1, N)) < 0.1
    m = rng.random((1, N)) < 0.8
    lv = rng.standard_normal(len(cu) - 1)
    adv, ret = run_gae(tun, np.float64, r, v, 0.95, 0.9, term=d, mask=m, lv=lv, cu=cu)
    ea, er = gae_oracle(r, v, 0.95, 0.9, term=d, mask=m, lv=lv, cu=cu)
    close(adv, ea, np.float64)
    close(ret, er, np.float64)


@MODES
def test_gae_packed_scalar_last_value_nan_isolation(tun):
    cu = np.array([0, 7, 20, 33], dtype=np.int64)
    rng, r, v = rng_data(5, 1, 33)
    r[0, 10] = np.nan  # poisons segment 1 only
    adv, _ = run_gae(tun, np.float64, r, v, 1.0, 1.0, lv=0.25, cu=cu)
    ea, _ = gae_oracle(r, v, 1.0, 1.0, lv=0.25, cu=cu)
    assert np.all(np.isfinite(adv[0, :7])) and np.all(np.isfinite(adv[0, 20:]))
    close(adv, ea, np.float64)


@MODES
def test_gae_nan_does_not_cross_done(tun):
    rng, r, v = rng_data(6, 2, 30)
    d = np.zeros((2, 30), dtype=bool)
    d[:, 11] = True
    r[:, 20] = np.nan  # after the done: the episode [0, 11] must stay finite
    v[:, 12] = np.inf  # the value right after the terminal step is not bootstrapped
    adv, ret = run_gae(tun, np.float64, r, v, 0.99, 0.95, term=d)
    assert np.all(np.isfinite(adv[:, :12])) and np.all(np.isfinite(ret[:, :12]))
    ea, er = gae_oracle(r, v, 0.99, 0.95, term=d)
    np.testing.assert_allclose(adv[:, :12], ea[:, :12], rtol=1e-12, atol=1e-12)


@MODES
def test_gae_time_major_view(tun):
    T, B = 23, 6
    rng = np.random.default_rng(7)
    r_tm = rng.standard_normal((T, B))
    v_tm = rng.standard_normal((T, B))
    d_tm = rng.random((T, B)) < 0.1
    r, v, d = r_tm.T, v_tm.T, d_tm.T  # (R, T) views, time stride > row stride
    adv_tm = np.zeros((T, B))
    ret_tm = np.zeros((T, B))
    p = GAEProblem(rows=rows_of(np.float64, B, T), rewards=r, values=v, next_values=None,
                   terminated=d, truncated=None, mask=None, gamma=0.9, lam=0.8,
                   last_value=np.arange(B, dtype=np.float64), advantages=adv_tm.T, returns=ret_tm.T)
    with cuda_settings(tun):
        cb.gae(p)
    ea, er = gae_oracle(r, v, 0.9, 0.8, term=d, lv=np.arange(B, dtype=np.float64))
    close(adv_tm.T, ea, np.float64)
    close(ret_tm.T, er, np.float64)


def test_gae_many_short_rows_and_partial_tiles():
    # Short rows: several rows per block; T=1 and T not a multiple of the tile.
    for T in (1, 5, 17):
        rng, r, v = rng_data(8 + T, 9, T)
        d = rng.random((9, T)) < 0.3
        adv, ret = run_gae(ROWS, np.float64, r, v, 0.9, 0.9, term=d, lv=1.5)
        close(adv, gae_oracle(r, v, 0.9, 0.9, term=d, lv=1.5)[0], np.float64)


def test_gae_strided_and_deterministic():
    rng = np.random.default_rng(9)
    base_r = rng.standard_normal((4, 70))
    base_v = rng.standard_normal((4, 70))
    r, v = base_r[::2, ::2], base_v[1::2, 1::2]  # arbitrary strides
    d = rng.random((2, 35)) < 0.1
    a1, _ = run_gae(LOOKBACK, np.float32, r, v, 0.99, 0.95, term=d)
    a2, _ = run_gae(LOOKBACK, np.float32, r, v, 0.99, 0.95, term=d)
    assert a1.tobytes() == a2.tobytes()
    close(a1, gae_oracle(r, v, float(np.float32(0.99)), float(np.float32(0.95)), term=d)[0], np.float32)


# Blocks of several warps: the block scan shuffles within each warp and folds the
# warps' aggregates in shared memory.  (name, tunables, R, T, time-major)
WARP_GEOMETRIES = [
    # RW=1, TW=64: two warps of 32 time-threads; three tiles walked per row.
    ("rows-rw1-2warps", dict(threads=64, k=1, rows_min_blocks=1), 2, 150, False),
    # RW=1, TW=96 (not a power of two): three warps; a block per tile.
    ("lookback-rw1-3warps", dict(threads=96, k=1, rows_min_blocks=10**9), 1, 200, False),
    # Short rows, RW=2, TW=32: 16 time-threads of each row per warp.
    ("rows-rw2", dict(threads=64, k=1, rows_min_blocks=1), 3, 20, False),
    # Time-major RW=4, TW=16: 8 time-threads of each row per warp, two warps.
    ("lookback-tm-rw4", dict(threads=64, k_time_major=1, rows_time_major=4,
                             rows_min_blocks=10**9), 6, 40, True),
    # Time-major RW=32, TW=2: one time-thread per warp (shared memory only).
    ("lookback-tm-rw32", dict(threads=64, k_time_major=1, rows_time_major=32,
                              rows_min_blocks=10**9), 33, 9, True),
]


def _warp_problem(geom, feature, seed):
    """GAE inputs (r, v, dones, mask, last values) of one of the WARP_GEOMETRIES."""
    _, tun, R, T, time_major = geom
    rng = np.random.default_rng(seed)
    if time_major:
        r, v = rng.standard_normal((T, R)).T, rng.standard_normal((T, R)).T
    else:
        r, v = rng.standard_normal((R, T)), rng.standard_normal((R, T))
    d = rng.random((R, T)) < 0.03
    m = rng.random((R, T)) < 0.85 if feature == "mask" else None
    return r, v, d, m, rng.standard_normal(R)


@pytest.mark.parametrize("feature", ["dones", "mask"])
@pytest.mark.parametrize("geom", WARP_GEOMETRIES, ids=[g[0] for g in WARP_GEOMETRIES])
def test_block_scan_across_warps(geom, feature):
    tun = geom[1]
    r, v, d, m, lv = _warp_problem(geom, feature, 18)
    adv, ret = run_gae(tun, np.float64, r, v, 0.97, 0.9, term=d, mask=m, lv=lv)
    ea, er = gae_oracle(r, v, 0.97, 0.9, term=d, mask=m, lv=lv)
    close(adv, ea, np.float64)
    close(ret, er, np.float64)


# --------------------------------------------------------------------------- returns


@MODES
def test_returns_dones_mask_lv(tun):
    R, T = 3, 33
    rng = np.random.default_rng(10)
    r = rng.standard_normal((R, T)).astype(np.float32)
    d = (rng.random((R, T)) < 0.1).astype(np.uint8)
    m = rng.random((R, T)) < 0.8
    r[~m] = np.nan
    lv = np.array([1.0, 2.0, -3.0])
    out = np.full((R, T), np.nan, dtype=np.float64)
    g = np.broadcast_to(np.array([[0.9], [0.99], [0.5]]), (R, T))
    p = ReturnsProblem(rows=rows_of(np.float64, R, T), rewards=r, dones=d, mask=m, gamma=g,
                       last_value=lv, returns=out)
    with cuda_settings(tun):
        cb.discounted_returns(p)
    assert np.all(out[~m] == 0)
    close(out, returns_oracle(r.astype(np.float64), g, dones=d, mask=m, lv=lv), np.float64)


@MODES
def test_returns_packed(tun):
    cu = np.array([0, 5, 5, 26, 27, 40], dtype=np.int64)
    rng = np.random.default_rng(11)
    r = rng.standard_normal((1, 40))
    d = rng.random((1, 40)) < 0.1
    lv = rng.standard_normal(5)
    out = np.full((1, 40), np.nan)
    p = ReturnsProblem(rows=rows_of(np.float64, 1, 40, cu), rewards=r, dones=d, mask=None,
                       gamma=0.9, last_value=lv, returns=out)
    with cuda_settings(tun):
        cb.discounted_returns(p)
    close(out, returns_oracle(r, 0.9, dones=d, lv=lv, cu=cu), np.float64)


# --------------------------------------------------------------------------- linear_scan


@MODES
@pytest.mark.parametrize("reverse", [False, True])
def test_scan(tun, reverse):
    R, T = 3, 35
    rng = np.random.default_rng(12 + reverse)
    a = rng.uniform(-1.1, 1.1, (R, T))
    b = rng.standard_normal((R, T)).astype(np.float32)
    init = np.array([0.5, -2.0, 1.0])
    out = np.full((R, T), np.nan)
    p = ScanProblem(rows=rows_of(np.float64, R, T), a=a, b=b, reverse=reverse, initial=init, out=out)
    with cuda_settings(tun):
        cb.linear_scan(p)
    close(out, scan_oracle(a, b.astype(np.float64), reverse, init), np.float64)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_time_major_scalar(reverse):
    T, B = 19, 5
    rng = np.random.default_rng(14)
    b_tm = rng.standard_normal((T, B)).astype(np.float32)
    out_tm = np.zeros((T, B), dtype=np.float32)
    p = ScanProblem(rows=rows_of(np.float32, B, T), a=float(np.float32(0.7)), b=b_tm.T,
                    reverse=reverse, initial=float(np.float32(1.0)), out=out_tm.T)
    with cb.override(**LOOKBACK):
        cb.linear_scan(p)
    close(out_tm.T, scan_oracle(float(np.float32(0.7)), b_tm.T.astype(np.float64), reverse, 1.0),
          np.float32)


# --------------------------------------------------------------------------- public API


def test_public_api_routes_here():
    gaescan = pytest.importorskip("gaescan")
    if not hasattr(gaescan, "gae"):
        pytest.skip("public API not available")
    rng = np.random.default_rng(15)
    r = rng.standard_normal((2, 20)).astype(np.float32)
    v = rng.standard_normal((2, 20)).astype(np.float32)
    d = rng.random((2, 20)) < 0.2
    with cb.override(**LOOKBACK):
        adv, ret = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="cuda")
        G = gaescan.discounted_returns(r, gamma=0.9, dones=d, backend="cuda")
        y = gaescan.linear_scan(0.5, r, backend="cuda")
    g32, l32 = float(np.float32(0.99)), float(np.float32(0.95))
    close(adv, gae_oracle(r, v, g32, l32, term=d)[0], np.float32)
    close(G, returns_oracle(r, float(np.float32(0.9)), dones=d), np.float32)
    close(y, scan_oracle(0.5, r, False), np.float32)


@pytest.mark.parametrize("case", ["plain", "dones-u8-lv", "mask", "1-D", "3-D-out", "f64-int-coeffs"])
def test_public_gae_on_the_cuda_backend(case):
    # The commonest calls (C-contiguous arrays, Python-scalar coefficients, out=) take
    # the one general route to the CUDA kernels.
    import gaescan

    rng = np.random.default_rng(19)
    shape = {"1-D": (45,), "3-D-out": (2, 2, 21)}.get(case, (3, 33))
    dt = np.float64 if case == "f64-int-coeffs" else np.float32
    r = rng.standard_normal(shape).astype(dt)
    v = rng.standard_normal(shape).astype(dt)
    kw = dict(gamma=1 if case == "f64-int-coeffs" else 0.97, lam=0.9)
    if case != "plain":
        kw["dones"] = rng.random(shape) < 0.1
    if case == "dones-u8-lv":
        kw["dones"] = kw["dones"].astype(np.uint8)
        kw["last_value"] = 0.25
    if case == "mask":
        kw["mask"] = rng.random(shape) < 0.8
    if case == "3-D-out":
        kw["out"] = (np.full(shape, np.nan, dt), np.full(shape, np.nan, dt))
    with cb.override(**ROWS):
        res = gaescan.gae(r, v, backend="cuda", **kw)
    if case == "3-D-out":
        assert res.advantages is kw["out"][0] and res.returns is kw["out"][1]
    a1 = res.advantages
    assert a1.dtype == dt and a1.shape == shape
    R = int(np.prod(shape[:-1]))
    want = gae_oracle(r.reshape(R, -1), v.reshape(R, -1), float(dt(kw["gamma"])), float(dt(kw["lam"])),
                      term=None if "dones" not in kw else kw["dones"].reshape(R, -1),
                      mask=None if "mask" not in kw else kw["mask"].reshape(R, -1),
                      lv=float(dt(kw.get("last_value", 0.0))))[0]
    close(a1.reshape(R, -1), want, dt)


def test_public_gae_refuses_an_out_that_overlaps_an_input_on_the_cuda_backend():
    import gaescan

    rng = np.random.default_rng(20)
    r = rng.standard_normal((2, 10)).astype(np.float32)
    v = rng.standard_normal((2, 10)).astype(np.float32)
    with pytest.raises(ValueError, match="overlaps the input"):
        gaescan.gae(r, v, gamma=0.9, lam=0.9, out=(r, np.empty_like(r)), backend="cuda")


# --------------------------------------------------------------------------- look-back walks


@pytest.mark.parametrize("layout", ["row-major", "time-major"])
def test_lookback_long_walks(layout):
    # 4 threads x 2 steps per tile: ~40 tiles per row; only every 16th tile publishes
    # its state, so look-backs span several windows of 4 flags.
    tun = dict(threads=4, k=2, k_f64=2, k_time_major=2, rows_time_major=2, rows_min_blocks=10**9,
               unpublished_tiles=True)
    R, T = 3, 83
    rng = np.random.default_rng(16)
    if layout == "row-major":
        r, v = rng.standard_normal((R, T)), rng.standard_normal((R, T))
    else:
        r, v = rng.standard_normal((T, R)).T, rng.standard_normal((T, R)).T
    d = rng.random((R, T)) < 0.05
    m = rng.random((R, T)) < 0.9
    lv = rng.standard_normal(R)
    adv, ret = run_gae(tun, np.float64, r, v, 0.97, 0.9, term=d, mask=m, lv=lv)
    ea, er = gae_oracle(r, v, 0.97, 0.9, term=d, mask=m, lv=lv)
    close(adv, ea, np.float64)
    close(ret, er, np.float64)
    adv2, _ = run_gae(dict(tun, unpublished_tiles=False), np.float64, r, v, 0.97, 0.9, term=d, mask=m, lv=lv)
    # Same association order however far the look-back walked: bit-identical.
    assert adv.tobytes() == adv2.tobytes()


def test_explicit_signature_launch_path():
    # On a GPU every launch goes through one dispatcher per dtype combination, with
    # all arrays typed as layout "A"; run that path here on contiguous, strided and
    # broadcast arguments (gamma per row: zero time stride).
    tun = dict(LOOKBACK, typed_in_sim=True)
    rng = np.random.default_rng(17)
    base = rng.standard_normal((3, 60))
    r, v = base[:, :30], np.ascontiguousarray(base[:, 30:])
    d = rng.random((3, 30)) < 0.1
    g = np.broadcast_to(np.array([[0.9], [0.95], [0.99]]), (3, 30))
    n_before = len(cb._typed_cache)
    adv, _ = run_gae(tun, np.float64, r, v, g, 0.9, term=d, lv=0.5)
    adv2, _ = run_gae(tun, np.float64, np.ascontiguousarray(r), v, np.ascontiguousarray(g), 0.9,
                      term=d, lv=0.5)
    close(adv, gae_oracle(r, v, g, 0.9, term=d, lv=0.5)[0], np.float64)
    assert adv.tobytes() == adv2.tobytes()
    # Contiguous and strided arguments share one typed dispatcher.
    assert len(cb._typed_cache) == n_before + 1
    # Another input dtype is another signature.
    adv3, _ = run_gae(tun, np.float64, r.astype(np.float32), v, g, 0.9, term=d, lv=0.5)
    assert len(cb._typed_cache) == n_before + 2
    close(adv3, gae_oracle(r.astype(np.float32), v, g, 0.9, term=d, lv=0.5)[0], np.float64)


# --------------------------------------------------------------------------- kernel variants

# The compile-time variants behind the "prefetch" and "fast_lookback" tunables, each
# against its baseline (the tunable off): the oracle's numbers, the baseline's bits,
# and the variant's code actually compiled and launched.
VARIANTS = [
    ("prefetch", dict(ROWS, prefetch=True), dict(ROWS, prefetch=False), "OPT_PREFETCH"),
    ("prefetch-2warps", dict(threads=64, k=1, rows_min_blocks=1, prefetch=True),
     dict(threads=64, k=1, rows_min_blocks=1, prefetch=False), "OPT_PREFETCH"),
    ("fast", dict(LOOKBACK, fast_lookback=True), dict(LOOKBACK, fast_lookback=False), "OPT_FASTLB"),
    ("fast-longwalk", dict(LONGWALK, fast_lookback=True), dict(LONGWALK, fast_lookback=False), "OPT_FASTLB"),
    # 2 steps per tile and 4 threads: windows of 4 lanes, many rounds per look-back.
    ("fast-tiny-warp", dict(LONGWALK, threads=4, fast_lookback=True),
     dict(LONGWALK, threads=4, fast_lookback=False), "OPT_FASTLB"),
    # 32 threads, 1 step each: warp 0 polls all the row's later tiles at once (lanes past tile 0).
    ("fast-full-warp", dict(threads=32, k=1, rows_min_blocks=10**9, fast_lookback=True),
     dict(threads=32, k=1, rows_min_blocks=10**9, fast_lookback=False), "OPT_FASTLB"),
]


def _problem(name, rng):
    """(call, oracle) for one float32 problem; ``call(tun)`` returns the outputs."""
    R, T = 2, 72
    f = np.float32
    r, v = rng.standard_normal((R, T)).astype(f), rng.standard_normal((R, T)).astype(f)
    d = rng.random((R, T)) < 0.05
    g, lam = float(f(0.97)), float(f(0.9))
    if name == "gae-dones":
        lv = rng.standard_normal(R).astype(f)
        return (lambda tun: run_gae(tun, f, r, v, g, lam, term=d, lv=lv),
                lambda: gae_oracle(r, v, g, lam, term=d, lv=lv))
    if name == "gae-f16-nan-after-done":
        r16, v16 = r.astype(np.float16), v.astype(np.float16)
        dd = np.zeros((R, T), bool)
        dd[:, 30] = True
        r16[:, 50] = np.nan  # after the done: the episode up to step 100 stays finite
        return (lambda tun: run_gae(tun, f, r16, v16, 1.0, 1.0, term=dd),
                lambda: gae_oracle(r16.astype(np.float64), v16.astype(np.float64), 1.0, 1.0, term=dd))
    if name == "gae-next-values":
        nv = rng.standard_normal((R, T)).astype(f)
        tr = rng.random((R, T)) < 0.05
        return (lambda tun: run_gae(tun, f, r, v, g, lam, nv=nv, term=d, trunc=tr),
                lambda: gae_oracle(r, v, g, lam, nv=nv, term=d, trunc=tr))
    if name == "gae-packed":
        cu = np.array([0, 0, 3, 50, 51, 120, 120, 144], dtype=np.int64)
        rp, vp = r.reshape(1, -1), v.reshape(1, -1)
        dp = d.reshape(1, -1)
        lv = rng.standard_normal(len(cu) - 1).astype(f)
        return (lambda tun: run_gae(tun, f, rp, vp, g, lam, term=dp, lv=lv, cu=cu),
                lambda: gae_oracle(rp, vp, g, lam, term=dp, lv=lv, cu=cu))
    if name == "returns-mask":
        m = rng.random((R, T)) < 0.8

        def call(tun):
            out = np.full((R, T), np.nan, dtype=f)
            p = ReturnsProblem(rows=rows_of(f, R, T), rewards=r, dones=d, mask=m, gamma=g,
                               last_value=0.5, returns=out)
            with cuda_settings(tun):
                cb.discounted_returns(p)
            return (out,)
        return call, lambda: (returns_oracle(r, g, dones=d, mask=m, lv=0.5),)
    if name.startswith("scan"):
        reverse = name == "scan-reverse"
        a = rng.uniform(-1.05, 1.05, (R, T)).astype(f)

        def call(tun):
            out = np.full((R, T), np.nan, dtype=f)
            p = ScanProblem(rows=rows_of(f, R, T), a=a, b=r, reverse=reverse, initial=1.5, out=out)
            with cuda_settings(tun):
                cb.linear_scan(p)
            return (out,)
        return call, lambda: (scan_oracle(a, r, reverse, 1.5),)
    raise AssertionError(name)


VARIANT_PROBLEMS = ["gae-dones", "gae-f16-nan-after-done", "gae-next-values", "gae-packed", "returns-mask",
                    "scan-forward", "scan-reverse"]


# Every problem on the two main variants; the geometry-stressing ones (the simulator
# is slow with them) on the problems that differ in the look-back's words or rows.
_SOME = {"prefetch-2warps": ["gae-dones", "gae-packed"],
         "fast-longwalk": ["gae-dones", "gae-packed", "returns-mask"],
         "fast-tiny-warp": ["gae-dones", "scan-forward"],
         "fast-full-warp": ["gae-next-values", "gae-packed"]}
VARIANT_CASES = [(v, p) for v in VARIANTS for p in _SOME.get(v[0], VARIANT_PROBLEMS)]


@pytest.fixture
def launched(monkeypatch):
    """The option bits of every kernel the backend asks for during the test."""
    from gaescan.kernels import cuda as kern

    seen = []
    real = kern.get_kernel

    def spy(kind, mode, fwd, dtype, nsh, k, opts=0):
        seen.append(opts)
        return real(kind, mode, fwd, dtype, nsh, k, opts)

    monkeypatch.setattr(kern, "get_kernel", spy)
    return seen


@pytest.mark.parametrize("variant,problem", VARIANT_CASES, ids=[f"{v[0]}-{p}" for v, p in VARIANT_CASES])
def test_kernel_variant(variant, problem, launched):
    from gaescan.kernels import cuda as kern

    _, tun, base, bit = variant
    call, oracle = _problem(problem, np.random.default_rng(VARIANT_PROBLEMS.index(problem)))
    got = call(tun)
    assert launched and all(o & getattr(kern, bit) for o in launched), "the variant was not compiled in"
    launched.clear()
    want = call(base)
    assert launched and not any(o & getattr(kern, bit) for o in launched)
    for x, w, e in zip(got, want, oracle(), strict=True):
        close(x, e, np.float32)
        assert x.tobytes() == w.tobytes(), "the variant changed the bits"
    if problem == "gae-f16-nan-after-done":
        assert np.all(np.isfinite(got[0][:, :31]))


@pytest.mark.parametrize("case", ["masked-gae", "float64", "time-major", "one-tile-rows"])
def test_kernel_variants_only_where_they_apply(case, launched):
    # The fast look-back needs float32 and (alpha, c) maps in one-row blocks; the
    # prefetch needs a second tile.  Elsewhere the tunables change nothing.
    from gaescan.kernels import cuda as kern

    rng = np.random.default_rng(21)
    R, T = 3, 40
    tun = dict(LOOKBACK, fast_lookback=True, prefetch=True)
    dt = np.float64 if case == "float64" else np.float32
    r, v = rng.standard_normal((R, T)).astype(dt), rng.standard_normal((R, T)).astype(dt)
    m = rng.random((R, T)) < 0.8 if case == "masked-gae" else None
    if case == "time-major":
        r, v = np.ascontiguousarray(r.T).T, np.ascontiguousarray(v.T).T
    if case == "one-tile-rows":
        tun = dict(ROWS, k=8, fast_lookback=True, prefetch=True)  # 8 threads x 8 steps > T
    adv, _ = run_gae(tun, dt, r, v, 0.9, 0.8, mask=m)
    close(adv, gae_oracle(r, v, float(dt(0.9)), float(dt(0.8)), mask=m)[0], dt)
    assert launched and not any(o & (kern.OPT_FASTLB | kern.OPT_PREFETCH) for o in launched)


# --------------------------------------------------------------------------- fast look-back, concurrently

# The simulator runs blocks one after another, so a look-back there always finds its
# later tiles published.  Threads of one block do run concurrently: warp 0 runs the
# fast look-back while another thread of the block publishes the records in a random
# order, with pauses, so the look-back meets unpublished tiles, maps without states,
# and states behind unpublished tiles.


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_lookback_waits_for_unpublished_tiles(seed, monkeypatch):
    import time

    from numba.cuda.simulator import kernelapi

    from gaescan.kernels import cuda as kern

    sleeps = []  # lane 0's back-off delays (every lane of the polling warp sleeps)

    def nanosleep(self, ns):
        if self.threadIdx.y == 0:
            sleeps.append(int(ns))
        time.sleep(0)

    monkeypatch.setattr(kernelapi.FakeCUDAModule, "nanosleep", nanosleep)

    parts = {}
    kern._build(kern.SCAN, kern.MODE_LOOKBACK, False, np.dtype(np.float32), 64, 1, kern.OPT_FASTLB, parts)
    fast_lookback, lb_pack, lb_word = parts["fast_lookback"], parts["lb_pack"], parts["lb_word"]
    rng = np.random.default_rng(seed)
    R, rr, c_rev = 2, 1, 70  # the state entering tile 70 of row 1 (tiles 0..69 are later in time)
    a = rng.uniform(0.5, 1.0, c_rev).astype(np.float32)
    a[rng.random(c_rev) < 0.1] = 0  # episode cuts
    c = rng.standard_normal(c_rev).astype(np.float32)
    state = np.zeros(c_rev, np.float32)  # state[j]: after tile j, by the kernels' own recurrence
    s = np.float32(rng.standard_normal())
    state[0] = s
    for j in range(1, c_rev):
        s = c[j] if a[j] == 0 else a[j] * s + c[j]
        state[j] = s
    # Publication events: (tile, word); tile 0 publishes its state only, others their
    # map and, some of them, later their state.
    events = [(0, 2)]
    for j in range(1, c_rev):
        events += [(j, 0), (j, 1)] + ([(j, 2)] if rng.random() < 0.2 else [])
    order = np.array(events, dtype=np.int64)[rng.permutation(len(events))]
    # A map's two words in either order, a state before or after its map: any order works.
    pause = rng.random(len(order)) < 0.3

    @cuda.jit
    def harness(lbw, out, order, pause, a, c, state):
        y = cuda.threadIdx.y
        if y < 32:
            A, Vn = fast_lookback(lbw, y, 64, R, rr, c_rev)
            if y == 0:
                out[0] = A
        elif y == 32:
            for i in range(order.shape[0]):
                if pause[i]:
                    time.sleep(0.002)  # simulator only: let warp 0 poll a few rounds
                j = order[i, 0]
                f = order[i, 1]
                val = a[j] if f == 0 else (c[j] if f == 1 else state[j])
                flag = kern.FLAG_INCL if f == 2 else kern.FLAG_AGG
                cuda.atomic.exch(lbw, lb_word(j, R, rr, f), lb_pack(flag, val))

    lbw = np.zeros(1 + 3 * (c_rev + 1) * R, np.uint64)
    out = np.zeros(1, np.float32)
    harness[1, (1, 64)](lbw, out, order, pause, a, c, state)
    # Whichever state the look-back started from, it applied the maps after it in
    # order: the same operations, the same bits.
    assert out[0].tobytes() == state[c_rev - 1].tobytes()
    # Rounds that met an unpublished nearest tile backed off, doubling up to the cap.
    assert sleeps and sleeps[0] == kern.BACKOFF_MIN_NS and max(sleeps) <= kern.BACKOFF_MAX_NS
    assert all(b in (min(a * 2, kern.BACKOFF_MAX_NS), kern.BACKOFF_MIN_NS) for a, b in itertools.pairwise(sleeps))


@pytest.mark.parametrize("which,K", [("owned", 4), ("owned", 3), ("coalesced", 1)])
def test_gpu_check_access_probes(which, K):
    # The gpu-check's elementwise probes (same traffic as GAE, no scan) compute what
    # the check compares them with, for lengths that are not a multiple of a block.
    from gaescan.bench import _probe

    rng = np.random.default_rng(23)
    n = 8 * K * 3 + 5
    r = rng.standard_normal(n).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)
    d = rng.random(n) < 0.3
    o1 = np.full(n, np.nan, np.float32)
    o2 = np.full(n, np.nan, np.float32)
    _probe.launch(which, r, v, d, o1, o2, K=K, threads=8)
    delta = r - v
    assert np.array_equal(o1, delta)
    assert np.array_equal(o2, np.where(d, r, delta + v))
    with pytest.raises(ValueError, match="unknown probe"):
        _probe.launch("other", r, v, d, o1, o2)


# --------------------------------------------------------------------------- 16-byte accesses

# OPT_VECTOR reads a thread's K steps VW (= 16 // itemsize) at a time and stores the
# staged outputs VW at a time; the backend sets it where K and T are multiples of VW
# (here: k=4 float32, k_f64=2 float64).  Tiles of 8 threads x 4 steps: rows of 72 steps
# cross tiles (and partial tiles), rows cross blocks.
VROWS = dict(threads=8, k=4, k_f64=2, rows_min_blocks=1)
VLOOKBACK = dict(VROWS, rows_min_blocks=10**9)
VECTOR_GEOMETRIES = [
    ("rows", VROWS),
    ("rows-prefetch", dict(VROWS, prefetch=True)),
    # RW=1, TW=64: two warps of 32 time-threads, 16-byte stores of 128-step runs.
    ("rows-2warps", dict(threads=64, k=4, k_f64=2, rows_min_blocks=1)),
    # Short rows, several per block (and one past the last row): 8 time-threads per warp.
    ("rows-4rows", dict(threads=32, k=4, k_f64=2, rows_min_blocks=1)),
    # The look-back driver shares the load and store code.
    ("lookback", VLOOKBACK),
    ("lookback-fast", dict(VLOOKBACK, fast_lookback=True)),
    ("longwalk", dict(VLOOKBACK, unpublished_tiles=True)),
]


def _vector_problem(name, rng):
    """(call, oracle) of one problem whose rows allow 16-byte accesses (T a multiple of 4)."""
    if name in ("gae-dones", "gae-next-values", "gae-packed", "returns-mask", "scan-forward", "scan-reverse"):
        return _problem(name, rng)
    R, T = 3, 40
    f = np.float32
    if name == "gae-dones-f64":
        r, v = rng.standard_normal((R, T)), rng.standard_normal((R, T))
        d = rng.random((R, T)) < 0.1
        lv = rng.standard_normal(R)
        return (lambda tun: run_gae(tun, np.float64, r, v, 0.97, 0.9, term=d, lv=lv),
                lambda: gae_oracle(r, v, 0.97, 0.9, term=d, lv=lv))
    if name == "gae-next-values-f64-mask":
        r, v, nv = (rng.standard_normal((R, T)) for _ in range(3))
        term = (rng.random((R, T)) < 0.08).astype(np.float32)
        trunc = rng.random((R, T)) < 0.08
        m = rng.random((R, T)) < 0.85
        return (lambda tun: run_gae(tun, np.float64, r, v, 0.99, 0.95, nv=nv, term=term, trunc=trunc, mask=m),
                lambda: gae_oracle(r, v, 0.99, 0.95, nv=nv, term=term, trunc=trunc, mask=m))
    r, v = rng.standard_normal((R, T)).astype(f), rng.standard_normal((R, T)).astype(f)
    d = rng.random((R, T)) < 0.1
    if name == "gae-mask-coeff-arrays":
        m = rng.random((R, T)) < 0.7
        m[1, :] = False  # a fully masked row
        m[2, -5:] = False  # a masked tail
        r[~m] = np.nan  # masked inputs are never used (16-byte loads read them)
        v[~m] = np.nan
        g = rng.uniform(0.8, 1.0, (R, T)).astype(f)  # per step
        lam = np.broadcast_to(np.array([[0.9], [0.5], [1.0]], dtype=f), (R, T))  # per row
        lv = np.array([0.5, -1.0, 2.0], dtype=f)
        return (lambda tun: run_gae(tun, f, r, v, g, lam, term=d, mask=m, lv=lv),
                lambda: gae_oracle(r, v, g, lam, term=d, mask=m, lv=lv))
    if name == "gae-truncated-only":
        nv = rng.standard_normal((R, T)).astype(f)
        tr = rng.random((R, T)) < 0.2
        return (lambda tun: run_gae(tun, f, r, v, 0.9, 0.7, nv=nv, trunc=tr),
                lambda: gae_oracle(r, v, float(f(0.9)), float(f(0.7)), nv=nv, trunc=tr))
    if name == "gae-nan-after-done":
        dd = np.zeros((R, T), dtype=bool)
        dd[:, 11] = True
        r[:, 20] = np.nan  # after the done: the episode [0, 11] stays finite
        v[:, 12] = np.inf  # the value right after the terminal step is not bootstrapped
        return (lambda tun: run_gae(tun, f, r, v, 0.99, 0.95, term=dd),
                lambda: gae_oracle(r, v, float(f(0.99)), float(f(0.95)), term=dd))
    if name == "gae-packed-mask-nan":
        # Empty segments, a one-step segment, segments crossing 16-byte groups and tiles.
        cu = np.array([0, 0, 3, 3, 4, 25, 31, 31, 44, 44, 60], dtype=np.int64)
        rp, vp = rng.standard_normal((1, 60)).astype(f), rng.standard_normal((1, 60)).astype(f)
        rp[0, 10] = np.nan  # poisons segment 4 only
        dp = rng.random((1, 60)) < 0.1
        mp = rng.random((1, 60)) < 0.8
        lv = rng.standard_normal(len(cu) - 1).astype(f)
        return (lambda tun: run_gae(tun, f, rp, vp, 0.95, 0.9, term=dp, mask=mp, lv=lv, cu=cu),
                lambda: gae_oracle(rp, vp, float(f(0.95)), float(f(0.9)), term=dp, mask=mp, lv=lv, cu=cu))
    if name == "returns-packed-f64":
        cu = np.array([0, 5, 5, 26, 27, 40], dtype=np.int64)
        rr = rng.standard_normal((1, 40))
        dd = rng.random((1, 40)) < 0.1
        lv = rng.standard_normal(5)

        def call(tun):
            out = np.full((1, 40), np.nan)
            p = ReturnsProblem(rows=rows_of(np.float64, 1, 40, cu), rewards=rr, dones=dd, mask=None,
                               gamma=0.9, last_value=lv, returns=out)
            with cuda_settings(tun):
                cb.discounted_returns(p)
            return (out,)
        return call, lambda: (returns_oracle(rr, 0.9, dones=dd, lv=lv, cu=cu),)
    if name == "scan-forward-f64":
        a, b = rng.uniform(-1.05, 1.05, (R, T)), rng.standard_normal((R, T))
        init = rng.standard_normal(R)

        def call(tun):
            out = np.full((R, T), np.nan)
            p = ScanProblem(rows=rows_of(np.float64, R, T), a=a, b=b, reverse=False, initial=init, out=out)
            with cuda_settings(tun):
                cb.linear_scan(p)
            return (out,)
        return call, lambda: (scan_oracle(a, b, False, init),)
    raise AssertionError(name)


VECTOR_PROBLEMS = ["gae-dones", "gae-dones-f64", "gae-next-values", "gae-next-values-f64-mask",
                   "gae-mask-coeff-arrays", "gae-truncated-only", "gae-nan-after-done", "gae-packed",
                   "gae-packed-mask-nan", "returns-mask", "returns-packed-f64", "scan-forward",
                   "scan-reverse", "scan-forward-f64"]
# Every problem in the plain rows driver; the other geometries on a few (the simulator is slow).
_VECTOR_SOME = {"rows-prefetch": ["gae-dones", "gae-next-values-f64-mask", "gae-packed-mask-nan",
                                  "returns-mask", "scan-forward"],
                "rows-2warps": ["gae-dones", "gae-mask-coeff-arrays", "scan-forward"],
                "rows-4rows": ["gae-dones-f64", "gae-next-values", "scan-forward"],
                "lookback": ["gae-dones", "gae-next-values-f64-mask", "gae-packed-mask-nan", "scan-forward"],
                "lookback-fast": ["gae-dones", "gae-packed", "scan-forward"],
                "longwalk": ["gae-dones", "scan-reverse"]}
VECTOR_CASES = [(g, p) for g in VECTOR_GEOMETRIES for p in _VECTOR_SOME.get(g[0], VECTOR_PROBLEMS)]


@pytest.mark.parametrize("geom,problem", VECTOR_CASES, ids=[f"{g[0]}-{p}" for g, p in VECTOR_CASES])
def test_vector_access(geom, problem, launched):
    # The oracle's numbers, and the element accesses' bits: only the instructions differ.
    from gaescan.kernels import cuda as kern

    tun = geom[1]
    rng = np.random.default_rng(VECTOR_PROBLEMS.index(problem))
    call, oracle = _vector_problem(problem, rng)
    got = call(dict(tun, vector_access=True))
    assert launched and all(o & kern.OPT_VECTOR for o in launched), "16-byte accesses were not compiled in"
    if tun.get("prefetch"):
        assert all(o & kern.OPT_PREFETCH for o in launched)
    launched.clear()
    want = call(dict(tun, vector_access=False))
    assert launched and not any(o & kern.OPT_VECTOR for o in launched)
    dt = got[0].dtype
    for x, w, e in zip(got, want, oracle(), strict=True):
        close(x, e, dt)
        assert x.tobytes() == w.tobytes(), "16-byte accesses changed the bits"
    if problem == "gae-nan-after-done":
        assert np.all(np.isfinite(got[0][:, :12])) and np.all(np.isfinite(got[1][:, :12]))
    if problem == "gae-packed-mask-nan":
        assert np.all(np.isfinite(got[0][0, :4])) and np.all(np.isfinite(got[0][0, 25:]))


class _CAI:
    """An array known only by its ``__cuda_array_interface__`` (a pointer, no memory)."""

    def __init__(self, ptr, shape, dtype=np.float32, strides=None):
        self.__cuda_array_interface__ = dict(data=(ptr, False), shape=tuple(shape), strides=strides,
                                             typestr=np.dtype(dtype).str, version=3)


class _CuPyLike:
    """An array known by CuPy's attributes (``data.ptr``, ``dtype``, ``shape``, ``strides``)."""

    def __init__(self, ptr, shape, dtype=np.float32, strides=None):
        from types import SimpleNamespace

        it = np.dtype(dtype).itemsize
        self.data = SimpleNamespace(ptr=ptr)
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.strides = strides if strides is not None else (shape[1] * it, it)


@pytest.mark.parametrize("cls", [_CAI, _CuPyLike])
def test_vector_ok_reads_pointers_and_strides(cls):
    ok = cb.vector_ok
    base = 1 << 20  # 256-byte aligned, as CUDA allocations are
    f4 = np.float32
    # C-contiguous rows of 36 float32 (144 bytes: every row on a 16-byte boundary).
    assert ok([cls(base, (3, 36)), cls(base + 4096, (3, 36)), None], f4)
    assert ok([cls(base + 16, (3, 36))], f4)
    assert not ok([cls(base, (3, 36)), cls(base + 4, (3, 36))], f4)  # one base pointer off by 4 bytes
    assert not ok([cls(base + 8, (3, 36))], f4)
    # Padded rows: a row stride that is a multiple of 16 bytes is fine, any other is not.
    assert ok([cls(base, (3, 36), strides=(160, 4))], f4)
    assert not ok([cls(base, (3, 36), strides=(148, 4))], f4)
    assert ok([cls(base, (1, 36), strides=(148, 4))], f4)  # one row: its stride is never used
    # Time not contiguous: strided, time-major, broadcast, reversed.
    assert not ok([cls(base, (3, 36), strides=(288, 8))], f4)
    assert not ok([cls(base, (3, 36), strides=(4, 12))], f4)
    assert not ok([cls(base, (3, 36), strides=(0, 0))], f4)
    assert not ok([cls(base + 140, (3, 36), strides=(144, -4))], f4)
    # Element types: every array must hold the compute dtype.
    assert not ok([cls(base, (3, 36), np.float16)], f4)
    assert not ok([cls(base, (3, 36)), cls(base, (3, 36), np.float64)], f4)
    assert ok([cls(base, (3, 36), np.float64)], np.float64)
    assert not ok([cls(base, (3, 36))], np.float64)
    # Not 2-D, or nothing to check.
    assert not ok([cls(base, (3, 36, 1), strides=(144, 4, 4))], f4)
    assert not ok([None, None], f4)


def test_vector_steps_needs_whole_16_byte_groups():
    assert cb.vector_steps(np.float32, 40, 8) and cb.vector_steps(np.float32, 4, 4)
    assert not cb.vector_steps(np.float32, 42, 8)  # T
    assert not cb.vector_steps(np.float32, 40, 2) and not cb.vector_steps(np.float32, 40, 6)  # K
    assert cb.vector_steps(np.float64, 42, 2) and not cb.vector_steps(np.float64, 41, 2)
    assert not cb.vector_steps(np.float64, 42, 3)
    assert not cb.vector_steps(np.float16, 64, 8)


def _aligned(shape, dtype, offset_bytes=0):
    """A C-contiguous NumPy array whose data starts ``offset_bytes`` past a 16-byte boundary."""
    it = np.dtype(dtype).itemsize
    n = int(np.prod(shape))
    buf = np.zeros(n + 64 // it, dtype=dtype)
    skip = (-buf.ctypes.data % 16 + offset_bytes) // it
    return buf[skip:skip + n].reshape(shape)


@pytest.mark.parametrize("case", ["aligned", "aligned-f64", "tunable-off", "f16-inputs", "T-not-multiple",
                                  "K-not-multiple", "misaligned-rewards", "misaligned-output",
                                  "strided-values", "time-major"])
def test_vector_access_only_where_valid(case, launched):
    # The backend sets OPT_VECTOR only where every 16-byte access is valid; elsewhere
    # the element accesses run, with the oracle's numbers.
    from gaescan.kernels import cuda as kern

    R, T = 2, 40
    dt = np.float64 if case == "aligned-f64" else np.float32
    tun = dict(VROWS)
    rng = np.random.default_rng(24)
    r, v = _aligned((R, T), dt), _aligned((R, T), dt)
    r[...] = rng.standard_normal((R, T))
    v[...] = rng.standard_normal((R, T))
    d = rng.random((R, T)) < 0.1
    out_off = 0
    if case == "tunable-off":
        tun["vector_access"] = False
    elif case == "f16-inputs":
        r, v = r.astype(np.float16), v.astype(np.float16)
    elif case == "T-not-multiple":
        r, v, d = r[:, :38].copy(), v[:, :38].copy(), d[:, :38]
    elif case == "K-not-multiple":
        tun["k"] = 2
    elif case == "misaligned-rewards":
        r2 = _aligned((R, T), dt, 4)
        r2[...] = r
        r = r2
    elif case == "misaligned-output":
        out_off = 4
    elif case == "strided-values":
        v = np.repeat(v, 2, axis=1)[:, ::2]
    elif case == "time-major":
        r, v = np.ascontiguousarray(r.T).T, np.ascontiguousarray(v.T).T
    T = r.shape[1]
    adv, ret = _aligned((R, T), dt, out_off), _aligned((R, T), dt)
    p = GAEProblem(rows=rows_of(dt, R, T), rewards=r, values=v, next_values=None, terminated=d,
                   truncated=None, mask=None, gamma=float(dt(0.97)), lam=float(dt(0.9)), last_value=0.5,
                   advantages=adv, returns=ret)
    with cuda_settings(tun):
        cb.gae(p)
    ea, er = gae_oracle(r.astype(np.float64), v.astype(np.float64), float(dt(0.97)), float(dt(0.9)),
                        term=d, lv=0.5)
    close(adv, ea, dt)
    close(ret, er, dt)
    assert len(launched) == 1
    assert bool(launched[0] & kern.OPT_VECTOR) == case.startswith("aligned")


def test_plan_reports_vector_access():
    # plan(vector=True): arrays that allow 16-byte accesses (fresh contiguous allocations).
    from gaescan.kernels import cuda as kern

    assert not cb.plan(256, 131072)["opts"] & kern.OPT_VECTOR
    p = cb.plan(256, 131072, vector=True)
    assert p["opts"] & kern.OPT_VECTOR and p["options"] == "vector_access"
    assert cb.plan(256, 131072, np.float64, vector=True)["opts"] & kern.OPT_VECTOR
    assert not cb.plan(256, 131072, time_major=True, vector=True)["opts"] & kern.OPT_VECTOR
    assert not cb.plan(256, 131070, vector=True)["opts"] & kern.OPT_VECTOR
    with cb.override(vector_access=False):
        assert not cb.plan(256, 131072, vector=True)["opts"] & kern.OPT_VECTOR
    with cb.override(k=2):
        assert not cb.plan(256, 131072, vector=True)["opts"] & kern.OPT_VECTOR


def test_float32_decay_near_one_on_a_long_row():
    # The default geometry on one row of 2^15 steps, rewards of one sign, γ = λ = 0.9999
    # (horizon about 5000 steps): the float32 kernels' relative error is 4e-5 here, so
    # such a scalar decay runs the float64 kernels on float64 copies.
    import gaescan

    rng = np.random.default_rng(1)
    r = rng.random((1, 1 << 15)).astype(np.float32)
    v = (rng.standard_normal((1, 1 << 15)) * 0.1).astype(np.float32)
    adv, ret = gaescan.gae(cuda.to_device(r), cuda.to_device(v), gamma=0.9999, lam=0.9999, backend="cuda")
    want = gt.gae(r, v, gamma=0.9999, lam=0.9999)
    gt.assert_close(np.asarray(adv), want.advantages, dtype=np.float32)
    gt.assert_close(np.asarray(ret), want.returns, dtype=np.float32)


def test_float32_decay_near_one_runs_in_float64_into_the_callers_outputs(monkeypatch):
    # The route itself, on short rows: float32 outputs (out= views of a larger buffer
    # included) hold the float64 kernels' results rounded once; a decay of exactly 1
    # and decays at most F32_STATE_MAX_DECAY keep the float32 kernels.
    rng = np.random.default_rng(2)
    R, T = 3, 300
    r = rng.random((R, T)).astype(np.float32)
    v = rng.standard_normal((R, T)).astype(np.float32)
    d = rng.random((R, T)) < 0.01
    launched = []
    real = cb._Launch.__init__

    def spy(self, rows, ref):
        launched.append(np.dtype(rows.dtype))
        real(self, rows, ref)

    monkeypatch.setattr(cb._Launch, "__init__", spy)
    f4 = np.float32
    for g, lam, wide in ((0.9999, 0.9999, True), (1.0, 1.0, False), (0.999, 1.0, False), (0.9999, 1.0, True)):
        g, lam = float(f4(g)), float(f4(lam))
        buf = np.zeros((2, R, T + 5), f4)
        adv, ret = buf[0, :, 2:-3], buf[1, :, 2:-3]
        launched.clear()
        cb.gae(GAEProblem(rows_of(f4, R, T), r, v, None, d, None, None, g, lam, 0.5, adv, ret))
        assert launched == [np.dtype(np.float64 if wide else f4)]
        ea, er = gae_oracle(r.astype(np.float64), v.astype(np.float64), g, lam, term=d, lv=0.5)
        close(adv, ea, f4)
        close(ret, er, f4)
        assert not buf[:, :, :2].any() and not buf[:, :, -3:].any()
        G = np.empty((R, T), f4)
        launched.clear()
        cb.discounted_returns(ReturnsProblem(rows_of(f4, R, T), r, d, None, g, 0.5, G))
        assert launched == [np.dtype(np.float64 if g != 1.0 and g > cb.F32_STATE_MAX_DECAY else f4)]
        close(G, returns_oracle(r.astype(np.float64), g, dones=d, lv=0.5), f4)
        y = np.empty((R, T), f4)
        cb.linear_scan(ScanProblem(rows_of(f4, R, T), g, r, True, 0.5, y))
        close(y, gt.linear_scan(g, r.astype(np.float64), reverse=True, initial=0.5), f4)


def test_float32_vtrace_on_policy_decay_near_one_on_a_long_row():
    # V-trace's on-policy decay is γλ: above F32_STATE_MAX_DECAY it computes in float64.
    import gaescan

    rng = np.random.default_rng(3)
    r = rng.random((1, 1 << 15)).astype(np.float32)
    v = (rng.standard_normal((1, 1 << 15)) * 0.1).astype(np.float32)
    lr = np.zeros_like(r)
    got = gaescan.vtrace(*(cuda.to_device(x) for x in (r, v, lr)), gamma=0.9999, lam=0.9999, backend="cuda")
    want = gt.vtrace(r, v, lr, gamma=0.9999, lam=0.9999)
    gt.assert_close(np.asarray(got.vs), want.vs, dtype=np.float32)
    gt.assert_close(np.asarray(got.advantages), want.advantages, dtype=np.float32)
