"""gaescan.whiten, moments and combine_moments against the float64 references: masks,
the edge rules (count <= ddof, count == 0), NaN at masked positions, large means in
float32, moments of any split, determinism, PyTorch and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import selected_backend_names
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gaescan
import gaescan.testing as gt

# The CPU backends; the CUDA backend has its own small cases (the simulator is slow).
BACKENDS = [b for b in selected_backend_names() if b in ("numba", "numpy")]
SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (5, 40000)]


def _case(rng, shape, dtype, p=0.7, mean=0.0):
    x = (mean + rng.standard_normal(shape)).astype(dtype)
    mask = rng.random(shape) < p
    return x, mask


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", [{}, {"ddof": 0}, {"shift_mean": False}, {"eps": 0.0}, {"eps": 0.3, "ddof": 0}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_against_reference(be, shape, dtype, opts):
    rng = np.random.default_rng(sum(shape) + np.dtype(dtype).itemsize)
    x, mask = _case(rng, shape, dtype, mean=2.0)
    got = gaescan.whiten(x, mask, backend=be, **opts)
    assert got.dtype == dtype and got.shape == x.shape
    gt.assert_close(got, gt.whiten(x, mask, **opts), dtype=dtype)
    assert np.all(got[~mask] == 0)
    # without a mask: every element
    gt.assert_close(gaescan.whiten(x, backend=be, **opts), gt.whiten(x, **opts), dtype=dtype)


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_moments_against_reference(be, dtype):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x, mask = _case(rng, shape, dtype, mean=-3.0)
        for mk in (mask, None, mask.astype(np.float32), mask.astype(np.int64)):
            m = gaescan.moments(x, mk, backend=be)
            want = gt.moments(x, mk)
            assert isinstance(m, gaescan.Moments)
            for f, w in zip(m, want, strict=True):
                assert isinstance(f, np.ndarray) and f.shape == () and f.dtype == np.float64
                np.testing.assert_allclose(f, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("shift_mean", [True, False])
def test_large_mean_float32(be, shift_mean):
    """Centred accumulation: float32 x = 1e4 + N(0, 1) still whitens within the contract's tolerance."""
    rng = np.random.default_rng(2)
    x, mask = _case(rng, (64, 3000), np.float32, mean=1e4)
    got = gaescan.whiten(x, mask, shift_mean=shift_mean, backend=be)
    gt.assert_close(got, gt.whiten(x, mask, shift_mean=shift_mean), dtype=np.float32)
    m = gaescan.moments(x, mask, backend=be)
    want = gt.moments(x, mask)
    np.testing.assert_allclose(float(m.m2), float(want.m2), rtol=1e-10)


@pytest.mark.parametrize("be", BACKENDS)
def test_masked_positions_never_read(be):
    rng = np.random.default_rng(3)
    x, mask = _case(rng, (6, 50), np.float32)
    clean = gaescan.whiten(x, mask, backend=be)
    for poison in (np.nan, np.inf, -np.inf, 3e38):
        dirty = np.where(mask, x, np.float32(poison))
        np.testing.assert_array_equal(gaescan.whiten(dirty, mask, backend=be), clean)
        assert tuple(map(float, gaescan.moments(dirty, mask, backend=be))) == tuple(
            map(float, gaescan.moments(x, mask, backend=be)))


@pytest.mark.parametrize("be", BACKENDS)
def test_nan_at_valid_position(be):
    x = np.array([1.0, np.nan, 3.0, 4.0])
    y = gaescan.whiten(x, np.array([1, 1, 1, 0]), backend=be)
    assert np.isnan(y[:3]).all() and y[3] == 0


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("poison", [np.inf, -np.inf, np.nan])
def test_nonfinite_valid_element_quietly(be, poison):
    # A non-finite valid element: m2 and every valid output NaN, as in the reference,
    # and no RuntimeWarning from the inf − inf inside the statistics.
    x = np.arange(3 * 5000, dtype=np.float64).reshape(3, 5000) % 7
    x[1, 17] = poison
    mask = x != 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = gaescan.whiten(x, mask, backend=be)
        m = gaescan.moments(x, mask, backend=be)
        parts = gaescan.combine_moments([gaescan.moments(x[:1], mask[:1], backend=be),
                                         gaescan.moments(x[1:], mask[1:], backend=be)])
    gt.assert_close(y, gt.whiten(x, mask))
    assert np.isnan(float(m.m2)) and np.isnan(float(parts.m2))
    assert not np.isfinite(float(m.mean)) and not np.isfinite(float(parts.mean))


@pytest.mark.parametrize("be", BACKENDS)
def test_small_counts(be):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = np.array([[4.0, 9.0], [1.0, 2.0]])
        # count == 0: all zeros, no NaN, no warning
        for opts in ({}, {"eps": 0.0}, {"shift_mean": False}):
            y = gaescan.whiten(x, np.zeros((2, 2), bool), backend=be, **opts)
            np.testing.assert_array_equal(y, np.zeros((2, 2)))
        m = gaescan.moments(x, np.zeros((2, 2)), backend=be)
        assert (float(m.count), float(m.mean), float(m.m2)) == (0.0, 0.0, 0.0)
        # count == 1 <= ddof: var = 0, the valid element whitens to 0
        one = np.array([[0, 1], [0, 0]])
        y = gaescan.whiten(x, one, backend=be)
        np.testing.assert_array_equal(y, np.zeros((2, 2)))
        y = gaescan.whiten(x, one, shift_mean=False, backend=be)
        np.testing.assert_array_equal(y, [[0.0, 9.0], [0.0, 0.0]])
        # count == 2 <= ddof = 2: var = 0, y = (x - mean) / sqrt(eps)
        two = np.array([[1, 1], [0, 0]])
        y = gaescan.whiten(x, two, ddof=2, eps=0.25, backend=be)
        np.testing.assert_allclose(y, [[-5.0, 5.0], [0.0, 0.0]])
        # empty input
        assert gaescan.whiten(np.zeros((0, 3), np.float32), backend=be).shape == (0, 3)
        assert float(gaescan.moments(np.zeros(0), backend=be).count) == 0


@pytest.mark.parametrize("be", BACKENDS)
def test_given_moments(be):
    """moments= replaces the local statistics: whitening one shard with the combined moments of
    all shards equals whitening the concatenation."""
    rng = np.random.default_rng(4)
    x, mask = _case(rng, (12, 30), np.float32, mean=50.0)
    shards = [slice(0, 5), slice(5, 5), slice(5, 12)]  # one empty shard (a rank with no data)
    ms = [gaescan.moments(x[s], mask[s], backend=be) for s in shards]
    total = gaescan.combine_moments(ms)
    full = gaescan.whiten(x, mask, backend=be)
    for s in shards:
        got = gaescan.whiten(x[s], mask[s], moments=total, backend=be)
        np.testing.assert_allclose(got, full[s], rtol=1e-5, atol=1e-6)
    # scalars are accepted as fields, count 0 gives zeros
    y = gaescan.whiten(x, mask, moments=gaescan.Moments(0.0, 7.0, 1.0), backend=be)
    np.testing.assert_array_equal(y, np.zeros_like(x))
    y = gaescan.whiten(x, mask, moments=(10.0, 50.0, 9.0), ddof=1, eps=0.0, backend=be)
    gt.assert_close(y, gt.whiten(x, mask, moments=(10.0, 50.0, 9.0), eps=0.0), dtype=np.float32)


@pytest.mark.parametrize("be", BACKENDS)
def test_inputs_unchanged_and_out(be):
    rng = np.random.default_rng(5)
    base, mbase = _case(rng, (8, 60), np.float64)
    x, mask = base[:, ::3], mbase[:, ::3]  # non-contiguous
    xb, mb = x.copy(), mask.copy()
    want = gt.whiten(x, mask)
    out = np.full(x.shape, np.nan)
    assert gaescan.whiten(x, mask, out=out, backend=be) is out
    gt.assert_close(out, want)
    big = np.full((8, 40), 5.0)
    gaescan.whiten(x, mask, out=big[:, ::2], backend=be)
    gt.assert_close(big[:, ::2], want)
    assert np.all(big[:, 1::2] == 5.0)
    np.testing.assert_array_equal(x, xb)
    np.testing.assert_array_equal(mask, mb)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, bool])
def test_input_dtypes(dtype):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 9)) * 3).astype(dtype)
    for be in BACKENDS:
        got = gaescan.whiten(x, backend=be)
        assert got.dtype == np.float32
        gt.assert_close(got, gt.whiten(x), dtype=np.float32)


@pytest.mark.parametrize("dtype", [">f8", ">f4", np.longdouble])
def test_other_byte_order_and_wider_floats(dtype):
    # A float64 in the other byte order is float64 data (a result of float64, at its
    # tolerance), not float32; a mean far above the spread shows the difference.
    rng = np.random.default_rng(8)
    x = (1e3 + rng.standard_normal(50)).astype(dtype)
    mask = rng.random(50) < 0.8
    want = np.float32 if np.dtype(dtype).itemsize == 4 else np.float64
    for be in BACKENDS:
        got = gaescan.whiten(x, mask, backend=be)
        assert got.dtype == want
        gt.assert_close(got, gt.whiten(x, mask), dtype=np.dtype(want))
        m = gaescan.moments(x, mask, backend=be)
        ref = gt.moments(x, mask)
        np.testing.assert_allclose(np.stack(m), np.stack(ref), rtol=1e-12 if want is np.float64 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_dimensional_x(dtype):
    # The data's own dtype decides the result's, whatever its shape: a 0-d x is no
    # weak scalar.
    x = np.array(3.0, dtype=dtype)
    for be in BACKENDS:
        got = gaescan.whiten(x, backend=be)
        assert got.dtype == dtype and got.shape == () and got == 0
        assert gaescan.whiten(x, out=np.empty((), dtype), backend=be) == 0
        m = gaescan.moments(x, backend=be)
        assert (float(m.count), float(m.mean), float(m.m2)) == (1.0, 3.0, 0.0)


def test_backends_agree_deterministic_and_thread_count():
    """Fixed chunks merged in a fixed order: the same bits run after run and at any thread count."""
    import numba

    from gaescan.backends import stats_numba

    rng = np.random.default_rng(7)
    # above the serial threshold, several chunks: the parallel build
    x, mask = _case(rng, (3, stats_numba.SERIAL_MAX // 2 + 1234), np.float32, mean=100.0)
    assert x.size > stats_numba.SERIAL_MAX and x.size > 3 * stats_numba.CHUNK
    a = gaescan.whiten(x, mask)
    m = gaescan.moments(x, mask)
    np.testing.assert_array_equal(a, gaescan.whiten(x, mask))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        np.testing.assert_array_equal(a, gaescan.whiten(x, mask))
        assert tuple(map(float, m)) == tuple(map(float, gaescan.moments(x, mask)))
    finally:
        numba.set_num_threads(before)
    np.testing.assert_allclose(gaescan.whiten(x, mask, backend="numpy"), a, rtol=1e-6, atol=1e-6)


def test_serial_build_same_bits():
    from gaescan.backends import stats_numba
    from gaescan.kernels import cpu_stats as k

    rng = np.random.default_rng(8)
    x = (rng.standard_normal(3 * stats_numba.CHUNK + 5) + 1e3).astype(np.float32)
    m = (rng.random(x.shape) < 0.5).view(np.uint8)
    res = [np.zeros(3), np.zeros(3)]
    for i, serial in enumerate((False, True)):
        k.masked_moments.compile(np.float32, serial)(m, True, stats_numba.CHUNK, res[i], x)
    np.testing.assert_array_equal(res[0], res[1])


SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), cuts=st.lists(st.integers(0, 300), max_size=6),
       p=st.sampled_from([0.0, 0.3, 1.0]), mean=st.sampled_from([0.0, 1e4]))
def test_combine_any_split(seed, n, cuts, p, mean):
    """Combining the moments of any split equals the one-shot moments."""
    rng = np.random.default_rng(seed)
    x = mean + rng.standard_normal(n)
    mask = rng.random(n) < p
    edges = [0, *sorted(min(c, n) for c in cuts), n]
    parts = [gaescan.moments(x[a:b], mask[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    one = gaescan.moments(x, mask)
    for combined in (gaescan.combine_moments(parts),
                     gaescan.combine_moments(gaescan.Moments(*(np.stack(f) for f in zip(*parts, strict=True))))):
        assert float(combined.count) == float(one.count)
        scale = max(abs(float(one.mean)), 1.0)
        assert abs(float(combined.mean) - float(one.mean)) <= 1e-13 * scale
        assert abs(float(combined.m2) - float(one.m2)) <= 1e-11 * max(float(one.m2), 1.0)
    ref = gt.combine_moments(parts)
    np.testing.assert_allclose(float(gaescan.combine_moments(parts).m2), float(ref.m2), rtol=1e-11, atol=1e-9)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 200), p=st.sampled_from([0.0, 0.5, 1.0]),
       ddof=st.integers(0, 2), shift_mean=st.booleans())
def test_permutation_property(seed, n, p, ddof, shift_mean):
    """Permuting the elements (with their mask) permutes the whitened result."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 3 + 1
    mask = rng.random(n) < p
    perm = rng.permutation(n)
    for be in BACKENDS:
        y = gaescan.whiten(x, mask, ddof=ddof, shift_mean=shift_mean, backend=be)
        yp = gaescan.whiten(x[perm], mask[perm], ddof=ddof, shift_mean=shift_mean, backend=be)
        np.testing.assert_allclose(yp, y[perm], rtol=1e-12, atol=1e-12)
        gt.assert_close(y, gt.whiten(x, mask, ddof=ddof, shift_mean=shift_mean))


def test_combine_forms():
    parts = gaescan.Moments(np.array([3.0, 0.0, 2.0]), np.array([2.0, np.nan, 5.0]), np.array([2.0, np.nan, 0.5]))
    m = gaescan.combine_moments(parts)  # an empty part's NaN mean (torch.mean of nothing) is ignored
    x = np.array([1.0, 2.0, 3.0, 4.5, 5.5])
    np.testing.assert_allclose([float(f) for f in m], [float(f) for f in gaescan.moments(x)])
    empty = gaescan.combine_moments(gaescan.Moments(np.zeros(0), np.zeros(0), np.zeros(0)))
    assert tuple(map(float, empty)) == (0.0, 0.0, 0.0)
    # trailing axes: independent statistics
    two = gaescan.combine_moments(gaescan.Moments(np.ones((2, 3)), np.arange(6.0).reshape(2, 3), np.zeros((2, 3))))
    assert two.count.shape == (3,)
    np.testing.assert_allclose(two.mean, [1.5, 2.5, 3.5])
    np.testing.assert_allclose(two.m2, [4.5, 4.5, 4.5])
    # a list of Moments of Python numbers, as whiten's moments= takes them
    listed = gaescan.combine_moments([gaescan.Moments(3.0, 2.0, 2.0), gaescan.Moments(2.0, 5.0, 0.5)])
    np.testing.assert_allclose([float(f) for f in listed], [float(f) for f in gaescan.moments(x)])
    with pytest.raises(ValueError, match="ms is empty"):
        gaescan.combine_moments([])


# --------------------------------------------------------------------------- PyTorch


def test_torch_in_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, mask = _case(rng, (4, 33), np.float32, mean=5.0)
    tx, tm = torch.from_numpy(x), torch.from_numpy(mask)
    y = gaescan.whiten(tx, tm)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    gt.assert_close(y, gt.whiten(x, mask), dtype=np.float32)
    m = gaescan.moments(tx, tm)
    assert all(isinstance(f, torch.Tensor) and f.dtype == torch.float64 and f.ndim == 0 for f in m)
    # the all_gather layout: one stacked tensor per field
    stacked = gaescan.Moments(*(torch.stack([f, f.new_zeros(())]) for f in m))
    c = gaescan.combine_moments(stacked)
    assert isinstance(c.count, torch.Tensor)
    assert float(c.count) == float(m.count)
    y2 = gaescan.whiten(tx, tm, moments=c)
    np.testing.assert_allclose(y2.numpy(), y.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="same array library"):
        gaescan.whiten(tx, mask)
    with pytest.raises(TypeError, match="same array library"):
        gaescan.whiten(x, mask, moments=m)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        (dict(mask=np.ones(5, bool)), ValueError, r"'mask' has shape \(5,\)"),
        (dict(mask=np.ones((2, 3), "U1")), TypeError, "mask"),
        (dict(ddof=-1), ValueError, "ddof"),
        (dict(ddof=0.5), TypeError, "ddof"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(eps="1e-8"), TypeError, "eps"),
        (dict(shift_mean=0), TypeError, "shift_mean must be a bool"),
        (dict(moments=3.0), TypeError, "gaescan.Moments"),
        (dict(moments=(1.0, 2.0)), TypeError, "gaescan.Moments"),
        (dict(moments=(np.ones(2), 0.0, 1.0)), ValueError, "moments.count must be a scalar"),
        (dict(moments=(-1.0, 0.0, 1.0)), ValueError, "moments.count must be >= 0"),
        (dict(moments=(None, 0.0, 1.0)), TypeError, "moments.count"),
        (dict(out=np.zeros((2, 3), np.float32)), ValueError, "dtype float64"),
        (dict(out=np.zeros(6)), ValueError, r"shape \(2, 3\)"),
        (dict(backend="cpu"), ValueError, "unknown backend"),
    ],
)
def test_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        gaescan.whiten(np.ones((2, 3)), **kw)


def test_errors_other():
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="overlaps"):
        gaescan.whiten(x, out=x)
    buf = np.array([6.0, 1.0, 0.5, 0.0, 0.0, 0.0])  # moments= read from the out buffer
    given = gaescan.Moments(*(buf[k:k + 1].reshape(()) for k in range(3)))
    for be in BACKENDS:
        with pytest.raises(ValueError, match="overlaps the input 'moments.count'"):
            gaescan.whiten(x.reshape(-1), moments=given, out=buf, backend=be)
    with pytest.raises(TypeError, match="scalar"):
        gaescan.whiten(1.0)
    with pytest.raises(ValueError, match="mask"):
        gaescan.moments(x, np.ones(3))
    with pytest.raises(TypeError, match="gaescan.Moments"):
        gaescan.combine_moments(np.ones(3))
    with pytest.raises(ValueError, match="stacked along a leading axis"):
        gaescan.combine_moments(gaescan.moments(x))
    with pytest.raises(ValueError, match="shape"):
        gaescan.combine_moments(gaescan.Moments(np.ones(2), np.ones(3), np.ones(2)))


# --------------------------------------------------------------------------- Dask


def test_dask():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(11)
    x, mask = _case(rng, (30, 41), np.float32, mean=1e4)
    dx, dm = da.from_array(x, chunks=(7, 13)), da.from_array(mask, chunks=(16, 20))  # unaligned chunks
    m = gaescan.moments(dx, dm)
    assert isinstance(m.count, da.Array)
    want = gt.moments(x, mask)
    np.testing.assert_allclose([float(f) for f in m], [float(f) for f in want], rtol=1e-12)
    for kw in ({}, {"ddof": 0, "shift_mean": False}):
        y = gaescan.whiten(dx, dm, **kw)
        assert isinstance(y, da.Array) and y.chunks == dx.chunks
        gt.assert_close(y.compute(), gt.whiten(x, mask, **kw), dtype=np.float32)
    gt.assert_close(gaescan.whiten(dx, mask).compute(), gt.whiten(x, mask), dtype=np.float32)
    gt.assert_close(gaescan.whiten(dx).compute(), gt.whiten(x), dtype=np.float32)
    # moments from another (lazy) population
    y = gaescan.whiten(dx, dm, moments=gaescan.moments(dx[:10], dm[:10]))
    gt.assert_close(y.compute(), gt.whiten(x, mask, moments=gt.moments(x[:10], mask[:10])), dtype=np.float32)
    with pytest.raises(ValueError, match="mask"):
        gaescan.whiten(dx, dm[:3])
    with pytest.raises(TypeError, match="out="):
        gaescan.whiten(dx, out=np.empty(x.shape, np.float32))


def test_dask_group_normalize():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(12)
    s = rng.standard_normal(60)
    labels = rng.integers(-5, 9, 60)
    got = gaescan.group_normalize(da.from_array(s, chunks=11), groups=da.from_array(labels, chunks=7))
    assert isinstance(got, da.Array)
    gt.assert_close(got.compute(), gt.group_normalize(s, groups=labels))
    got = gaescan.group_normalize(da.from_array(s, chunks=11), group_size=6, leave_one_out=True, scale=False)
    gt.assert_close(got.compute(), gt.group_normalize(s, group_size=6, leave_one_out=True, scale=False))
    with pytest.raises(ValueError, match="does not divide"):
        gaescan.group_normalize(da.from_array(s, chunks=11), group_size=7)
    with pytest.raises(TypeError, match="integer labels"):
        gaescan.group_normalize(da.from_array(s, chunks=11), groups=da.from_array(s, chunks=11))


# --------------------------------------------------------------------------- CUDA (simulator or GPU)


def _cuda_arrays():
    """``(to_device, to_host)`` for the CUDA backend: NumPy arrays under the simulator,
    CuPy arrays on a GPU; skip when there is neither."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return (lambda a: a), (lambda a: np.asarray(a))
    cp = pytest.importorskip("cupy")
    if not cp.cuda.is_available():
        pytest.skip("no GPU and not under NUMBA_ENABLE_CUDASIM=1")
    return cp.asarray, cp.asnumpy


@pytest.mark.cudasim
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_whiten_and_moments(dtype):
    dev, host = _cuda_arrays()
    rng = np.random.default_rng(13)
    # float64 with |mean| ≫ std would sit at the limit of its own rounding (one ulp of the mean
    # is 1e-12 of the std at |mean| / std = 1e4), so the large mean is checked in float32.
    x, mask = _case(rng, (3, 457), dtype, mean=1e4 if dtype == np.float32 else 10.0)
    dirty = np.where(mask, x, np.nan).astype(dtype)  # masked elements are never read
    m = gaescan.moments(dev(dirty), dev(mask), backend="cuda")
    want = gt.moments(x, mask)
    np.testing.assert_allclose([float(host(f)) for f in m], [float(f) for f in want], rtol=1e-12)
    for kw in ({}, {"ddof": 0, "shift_mean": False, "eps": 0.1}):
        y = gaescan.whiten(dev(dirty), dev(mask), backend="cuda", **kw)
        gt.assert_close(host(y), gt.whiten(x, mask, **kw), dtype=dtype)
    y = gaescan.whiten(dev(x), backend="cuda")
    gt.assert_close(host(y), gt.whiten(x), dtype=dtype)
    # given moments (device 0-d arrays or floats), a non-contiguous out, count == 0
    y = gaescan.whiten(dev(x), dev(mask), moments=m, backend="cuda")
    gt.assert_close(host(y), gt.whiten(x, mask), dtype=dtype)
    out = dev(np.zeros((3, 914), dtype))
    gaescan.whiten(dev(x), dev(mask), out=out[:, ::2], backend="cuda")
    gt.assert_close(host(out)[:, ::2], gt.whiten(x, mask), dtype=dtype)
    assert np.all(host(out)[:, 1::2] == 0)
    y = gaescan.whiten(dev(x), dev(np.zeros_like(mask)), backend="cuda")
    assert np.all(host(y) == 0)
    # a non-finite valid element: m2 NaN, so every valid output NaN, also where the mean is ±inf
    for poison in (np.inf, -np.inf, np.nan):
        bad = np.arange(12, dtype=dtype).reshape(3, 4)
        bad[1, 3] = poison
        for kw in ({}, {"eps": 0.3, "ddof": 0, "shift_mean": False}):
            gt.assert_close(host(gaescan.whiten(dev(bad), backend="cuda", **kw)), gt.whiten(bad, **kw), dtype=dtype)
    assert float(host(gaescan.moments(dev(x[:0]), backend="cuda").count)) == 0


@pytest.mark.cudasim
def test_cuda_group_normalize():
    dev, host = _cuda_arrays()
    rng = np.random.default_rng(14)
    s = rng.standard_normal(50).astype(np.float32)
    labels = rng.integers(-3, 7, 50)
    for kw in ({}, {"leave_one_out": True, "scale": False}, {"ddof": 0}):
        got = gaescan.group_normalize(dev(s), groups=dev(labels), backend="cuda", **kw)
        gt.assert_close(host(got), gt.group_normalize(s, groups=labels, **kw), dtype=np.float32)
    got = gaescan.group_normalize(dev(s), group_size=5, backend="cuda")
    gt.assert_close(host(got), gt.group_normalize(s, group_size=5), dtype=np.float32)
    # equal scores with eps = 0: 0/0 = NaN in that group only
    s[:5] = 0.75
    for kw in ({"groups": dev(np.repeat(np.arange(10), 5))}, {"group_size": 5}):
        got = host(gaescan.group_normalize(dev(s), eps=0.0, backend="cuda", **kw))
        assert np.isnan(got[:5]).all()
        gt.assert_close(got[5:], gt.group_normalize(s, group_size=5, eps=0.0)[5:], dtype=np.float32)


@pytest.mark.ptx
@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_cuda_kernels_lower_to_ptx(cc):
    """The moments and whitening kernels compile for the GPU (no GPU needed: NVVM only)."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("the CUDA simulator is enabled: nothing is compiled")
    cuda = pytest.importorskip("numba.cuda")
    from numba import types

    from gaescan.kernels import cuda_stats as k

    def arr(t, nd=1):
        return types.Array(t, nd, "C")

    for ft in (types.float32, types.float64):
        for kern, sig in [
            (k.moments_partial, (arr(ft), arr(types.uint8), types.boolean, types.int64, arr(types.float64, 2))),
            (k.moments_final, (arr(types.float64, 2), arr(types.float64))),
            (k.normalize, (arr(ft), arr(types.uint8), types.boolean, arr(types.float64), types.boolean,
                           types.float64, types.float64, arr(ft))),
        ]:
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
            assert ".entry" in ptx


def test_numpy_backend_blocks(monkeypatch):
    """The NumPy-API backend's blocks (merged with the pairwise update) give the one-block numbers."""
    from gaescan.backends import stats_numpy

    monkeypatch.setattr(stats_numpy, "BLOCK", 97)
    rng = np.random.default_rng(15)
    x, mask = _case(rng, (7, 131), np.float32, mean=1e4)
    x[:, :40] = 0  # a block of masked-out or constant data next to others
    mask[:2] = False
    for mk in (mask, None):
        m = gaescan.moments(x, mk, backend="numpy")
        np.testing.assert_allclose([float(f) for f in m], [float(f) for f in gt.moments(x, mk)], rtol=1e-12)
        gt.assert_close(gaescan.whiten(x, mk, backend="numpy"), gt.whiten(x, mk), dtype=np.float32)
    out = np.zeros((7, 262), np.float32)
    gaescan.whiten(x, mask, out=out[:, ::2], shift_mean=False, backend="numpy")
    gt.assert_close(out[:, ::2], gt.whiten(x, mask, shift_mean=False), dtype=np.float32)


@pytest.mark.parametrize("kind", ["stationary", "drifting", "nan", "masked-first-chunks"])
def test_numba_moments_chunks(kind):
    """The chunks' one-pass shifted sums and their two-pass fallback (a chunk far from the
    pilot mean, a NaN) both give the centred statistics."""
    from gaescan.backends import stats_numba

    rng = np.random.default_rng(16)
    C = stats_numba.CHUNK
    n = 5 * C + 77
    x = 1e3 + rng.standard_normal(n)
    mask = rng.random(n) < 0.9
    if kind == "drifting":
        x += np.repeat([0.0, 1e6, -5e5, 3.0, 1e-3, 7e4], C)[:n]
    elif kind == "nan":
        x[3 * C + 5] = np.nan
        mask[3 * C + 5] = True
    elif kind == "masked-first-chunks":
        mask[: 2 * C + 3] = False
    for xs in (x, x.astype(np.float32)):
        for mk in (mask, None):
            got = [float(f) for f in gaescan.moments(xs, mk)]
            want = [float(f) for f in gt.moments(xs, mk)]
            if kind == "nan":
                assert np.isnan(got[1:]).all() and np.isnan(want[1:]).all() and got[0] == want[0]
                continue
            np.testing.assert_allclose(got, want, rtol=1e-12)
