"""Dask arrays: lazy results equal to the in-memory ones, on every chunking.

Inputs are chunked along time and batch in many ways (single chunk, ragged,
chunks of one step, empty chunks); results must keep the input's chunks, stay
lazy, and equal the in-memory gaescan result and the float64 oracle within
the SPEC tolerance.  Most cases run on the threaded scheduler; a few run on a
``distributed.LocalCluster`` of two worker processes (``test_distributed_*``,
one cluster for the module; deselect with ``-k "not distributed"``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, flag_kwargs, random_data, random_flags

import gaescan
import gaescan.testing as gt
from gaescan._dispatch import cuda_simulator

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

B, T = 6, 67
# Chunkings of a (B, T) array: one chunk, ragged, one step per chunk, empty chunks.
CHUNKINGS = {
    "single": ((6,), (67,)),
    "ragged": ((2, 4), (1, 30, 36)),
    "even": ((3, 3), (10,) * 6 + (7,)),
    "rows-of-one": ((1,) * 6, (17, 17, 17, 16)),
    "steps-of-one": ((6,), (1,) * 67),
    "empty-chunks": ((0, 6), (0, 20, 0, 47, 0)),
}


def compute(*xs):
    with dask.config.set(scheduler="threads"):
        return dask.compute(*xs)


def chunked(x, chunks, axis=-1):
    """``x`` as a Dask array; ``chunks`` are given for (B, T) and swapped for time-major inputs."""
    if x.ndim == 2 and axis == 0:
        chunks = chunks[::-1]
    return da.from_array(x, chunks=chunks)


def shape_for(axis):
    return (B, T) if axis == -1 else (T, B)


def check(actual, expected, dtype, chunks=None):
    assert isinstance(actual, da.Array), type(actual)
    if chunks is not None:
        assert actual.chunks == chunks
    assert actual.dtype == np.dtype(dtype)
    (got,) = compute(actual)
    assert_close(got, expected, dtype)
    return got


# ----------------------------------------------------------------------- GAE


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("flags", ["none", "dones", "term+trunc"])
def test_gae_chunkings(rng, chunking, axis, flags):
    shape = shape_for(axis)
    r, v = random_data(rng, shape), random_data(rng, shape)
    kw = flag_kwargs(flags, rng, shape, v)
    if "next_values" not in kw:
        kw["last_value"] = random_data(rng, (B,))
    chunks = CHUNKINGS[chunking]
    dkw = {k: chunked(x, chunks, axis) if isinstance(x, np.ndarray) and x.shape == shape else x
           for k, x in kw.items()}
    R, V = chunked(r, chunks, axis), chunked(v, chunks, axis)
    adv, ret = gaescan.gae(R, V, gamma=0.99, lam=0.95, axis=axis, **dkw)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, axis=axis, **kw)
    mem = gaescan.gae(r, v, gamma=0.99, lam=0.95, axis=axis, **kw)
    got = check(adv, ref[0], np.float32, R.chunks)
    check(ret, ref[1], np.float32, R.chunks)
    gt.assert_close(got, mem.advantages, dtype=np.float32)


@pytest.mark.parametrize("chunking", ["ragged", "steps-of-one", "empty-chunks", "rows-of-one"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0])
def test_gae_every_feature(rng, chunking, dtype, axis):
    """Flags, masks (with whole chunks masked), per-step γ, per-row λ, both boundaries, NaN past dones."""
    shape = shape_for(axis)
    chunks = CHUNKINGS[chunking]
    r, v = random_data(rng, shape, dtype), random_data(rng, shape, dtype)
    term = random_flags(rng, shape, 0.08, np.int8)
    m = random_flags(rng, shape, 0.7)
    tix = [slice(None)] * 2
    tix[axis] = slice(31, 60)
    m[tuple(tix)] = False                       # whole time chunks masked (most chunkings)
    r[~m] = np.nan                              # masked positions are never read
    gamma = rng.uniform(0.9, 1.0, shape).astype(dtype)
    lam = rng.uniform(0.5, 1.0, (B, 1) if axis == -1 else (1, B)).astype(dtype)
    lv = random_data(rng, (B,), dtype)
    la = random_data(rng, (B,), dtype)
    kw = dict(gamma=gamma, lam=lam, terminated=term, mask=m, last_value=lv, last_advantage=la, axis=axis)
    dkw = dict(
        kw,
        gamma=da.from_array(gamma, chunks=5),   # different chunks: aligned by the backend
        terminated=chunked(term, chunks, axis),
        mask=m,                                  # a NumPy array mixed in: wrapped with the data's chunks
        last_value=da.from_array(lv, chunks=4),
    )
    R, V = chunked(r, chunks, axis), chunked(v, chunks, axis)
    adv, ret = gaescan.gae(R, V, **dkw)
    ref = gt.gae(r, v, **kw)
    got = check(adv, ref[0], dtype, R.chunks)
    check(ret, ref[1], dtype, R.chunks)
    assert np.all(got[~m] == 0)
    mem = gaescan.gae(r, v, **kw)
    gt.assert_close(got, mem.advantages, dtype=dtype)


def test_gae_nan_beyond_done_across_chunks(rng):
    r, v = random_data(rng, (B, T), np.float64), random_data(rng, (B, T), np.float64)
    d = np.zeros((B, T), bool)
    d[:, 29] = True
    r[:, 30:] = np.nan
    v[:, 30:] = np.nan
    chunks = ((3, 3), (10, 20, 1, 36))
    adv, _ = gaescan.gae(da.from_array(r, chunks=chunks), da.from_array(v, chunks=chunks), gamma=0.99,
                         lam=0.95, dones=d)
    (got,) = compute(adv)
    assert np.all(np.isfinite(got[:, :30])) and np.all(np.isnan(got[:, 30:]))
    assert_close(got, gt.gae(r, v, gamma=0.99, lam=0.95, dones=d)[0], np.float64)


def test_gae_three_dims_middle_axis(rng):
    shape = (3, 41, 2)
    r, v = random_data(rng, shape), random_data(rng, shape)
    d = random_flags(rng, shape, 0.1)
    chunks = ((1, 2), (5, 20, 16), (1, 1))
    adv, ret = gaescan.gae(da.from_array(r, chunks=chunks), da.from_array(v, chunks=chunks), gamma=0.9,
                           lam=0.8, dones=da.from_array(d, chunks=chunks), last_value=np.ones((3, 2), np.float32), axis=1)
    ref = gt.gae(r, v, gamma=0.9, lam=0.8, dones=d, last_value=np.ones((3, 2), np.float32), axis=1)
    check(adv, ref[0], np.float32, chunks)
    check(ret, ref[1], np.float32, chunks)


def test_gae_one_dimensional(rng):
    r, v = random_data(rng, (100,), np.float64), random_data(rng, (100,), np.float64)
    d = random_flags(rng, (100,), 0.05)
    adv, _ = gaescan.gae(da.from_array(r, chunks=13), da.from_array(v, chunks=13), gamma=0.99, lam=0.95,
                         dones=d, last_value=2.0, last_advantage=-1.0)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=2.0, last_advantage=-1.0)
    check(adv, ref[0], np.float64)


@pytest.mark.slow
def test_gae_long_rows_float32(rng):
    """2^17-step rows in 27 time chunks (the last one ragged), γλ = 1: within the SPEC tolerance of the oracle."""
    n = 1 << 17
    r, v = random_data(rng, (2, n)), random_data(rng, (2, n))
    d = random_flags(rng, (2, n), 1e-4)
    chunks = ((1, 1), (5000,) * 26 + (n - 130000,))
    adv, ret = gaescan.gae(da.from_array(r, chunks=chunks), da.from_array(v, chunks=chunks), gamma=1.0,
                           lam=1.0, dones=d)
    ref = gt.gae(r, v, gamma=1.0, lam=1.0, dones=d)
    check(adv, ref[0], np.float32)
    check(ret, ref[1], np.float32)


# ------------------------------------------------------------ returns, scans


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_returns_chunkings(rng, chunking, axis, dtype):
    shape = shape_for(axis)
    chunks = CHUNKINGS[chunking]
    r = random_data(rng, shape, dtype)
    d = random_flags(rng, shape, 0.1, np.float32)
    m = random_flags(rng, shape, 0.8)
    lv = random_data(rng, (B,), dtype)
    gamma = rng.uniform(0.9, 1.0, (B, 1) if axis == -1 else (1, B)).astype(dtype)
    G = gaescan.discounted_returns(chunked(r, chunks, axis), gamma=gamma, dones=chunked(d, chunks, axis),
                                   mask=chunked(m, chunks, axis), last_value=lv, axis=axis)
    ref = gt.discounted_returns(r, gamma=gamma, dones=d, mask=m, last_value=lv, axis=axis)
    got = check(G, ref, dtype, chunked(r, chunks, axis).chunks)
    mem = gaescan.discounted_returns(r, gamma=gamma, dones=d, mask=m, last_value=lv, axis=axis)
    gt.assert_close(got, mem, dtype=dtype)


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("a_kind", ["scalar", "dask-array", "numpy-per-row"])
def test_scan_chunkings(rng, chunking, reverse, a_kind):
    chunks = CHUNKINGS[chunking]
    b = random_data(rng, (B, T), np.float64)
    a_np = np.where(rng.random((B, T)) < 0.05, 0.0, rng.uniform(-1.01, 1.01, (B, T)))
    a, a_ref = {
        "scalar": (0.98, 0.98),
        "dask-array": (da.from_array(a_np, chunks=chunks), a_np),
        "numpy-per-row": (a_np[:, :1], a_np[:, :1]),
    }[a_kind]
    init = random_data(rng, (B,), np.float64)
    y = gaescan.linear_scan(a, da.from_array(b, chunks=chunks), reverse=reverse, initial=init)
    ref = gt.linear_scan(a_ref, b, reverse=reverse, initial=init)
    got = check(y, ref, np.float64, chunks)
    mem = gaescan.linear_scan(a_ref, b, reverse=reverse, initial=init)
    gt.assert_close(got, mem, dtype=np.float64)


def test_numpy_b_takes_the_chunks_of_a_dask_a(rng):
    b = random_data(rng, (B, T))
    a = da.from_array(rng.uniform(0.5, 1.0, (B, T)).astype(np.float32), chunks=(2, 25))
    y = gaescan.linear_scan(a, b, reverse=True)
    check(y, gt.linear_scan(a.compute(), b, reverse=True), np.float32, a.chunks)


def test_backend_override_runs_on_the_blocks(rng):
    r = random_data(rng, (B, T))
    G = gaescan.discounted_returns(da.from_array(r, chunks=(3, 20)), gamma=0.9, backend="numpy")
    check(G, gt.discounted_returns(r, gamma=0.9), np.float32)


# ------------------------------------------------------------ laziness, edges


def test_results_are_lazy_and_keep_chunks(rng):
    calls = []

    def spy(x):
        calls.append(x.shape)
        return x

    r = da.from_array(random_data(rng, (B, T)), chunks=(3, 20)).map_blocks(spy, meta=np.empty((0, 0), "f4"))
    calls.clear()
    adv, ret = gaescan.gae(r, r, gamma=0.9, lam=0.9)
    assert calls == []  # nothing computed yet
    assert adv.chunks == ret.chunks == r.chunks
    compute(adv)
    assert (3, 20) in calls
    assert adv.name != ret.name


def test_blocks_depend_only_on_their_own_inputs_and_carries(rng):
    """A final block reads its own input blocks and per-row carries; a carry, one block's summary."""
    from dask.core import get_dependencies

    chunks = CHUNKINGS["ragged"]
    arrays = {k: da.from_array(random_data(rng, (B, T)), chunks=chunks) for k in ("r", "v")}
    m = da.from_array(random_flags(rng, (B, T), 0.7), chunks=chunks)
    adv, _ = gaescan.gae(arrays["r"], arrays["v"], gamma=0.9, lam=0.9, mask=m)
    graph = dict(adv.__dask_graph__())
    inputs = {arrays["r"].name, arrays["v"].name, m.name}
    out_keys = [key for row in adv.__dask_keys__() for key in row]
    finals = {dep for key in out_keys for dep in get_dependencies(graph, key)}  # (adv, ret) per block
    assert len(finals) == len(out_keys)
    carries = set()
    for fkey in finals:
        idx = fkey[1:]
        for dep in get_dependencies(graph, fkey):
            if dep[0] in inputs:
                assert dep[1:] == idx, (fkey, dep)       # only its own block of every input
            else:
                assert "carry" in dep[0], (fkey, dep)    # ... and per-row carries
                carries.add(dep)
                for d2 in get_dependencies(graph, dep):  # a carry: one summary + the next carry
                    assert "carry" in d2[0] or "summary" in d2[0], d2
                    if "summary" in d2[0]:
                        own = [d3 for d3 in get_dependencies(graph, d2) if d3[0] in inputs]
                        assert {d3[1:] for d3 in own} == {d2[1:]}, d2
    assert len(carries) >= 2 * B // 2  # bootstrap and advantage carries of several blocks
    # Carries are tiny: one number per row of the block.
    for key in carries:
        (value,) = dask.get(graph, [key])
        assert value.shape == (chunks[0][key[1]],), (key, value.shape)


@pytest.mark.parametrize("shape", [(B, 0), (0, T), (0, 0)])
def test_empty(shape):
    r = da.zeros(shape, dtype=np.float32, chunks=3)
    adv, ret = gaescan.gae(r, r, gamma=0.9, lam=0.9, last_value=np.zeros(shape[0], np.float32))
    got, _ = compute(adv, ret)
    assert got.shape == shape and got.dtype == np.float32
    G = gaescan.discounted_returns(r, gamma=0.9)
    assert compute(G)[0].shape == shape


def test_all_numpy_but_a_dask_boundary(rng):
    r = random_data(rng, (B, T))
    lv = random_data(rng, (B,))
    G = gaescan.discounted_returns(r, gamma=0.9, last_value=da.from_array(lv, chunks=2))
    assert isinstance(G, da.Array)
    check(G, gt.discounted_returns(r, gamma=0.9, last_value=lv), np.float32)


@pytest.mark.parametrize("chunking", ["even", "steps-of-one", "empty-chunks"])
def test_float64_result_from_one_float64_argument(rng, chunking):
    # float32 data and one float64 argument: the result is float64, and so is every
    # block's computation, γ's rounding and the carry between time chunks, also in
    # the blocks the float64 argument never reaches.
    r = random_data(rng, (B, T), np.float32)
    v = random_data(rng, (B, T), np.float32)
    mask = rng.random((B, T)) < 0.6
    mask[:, 20:47] = False  # whole chunks of padding
    lv = random_data(rng, (B,), np.float64)
    g8 = np.full((B, T), 0.9)
    R, V, M = (chunked(x, CHUNKINGS[chunking]) for x in (r, v, mask))

    def calls(lib, r, v, mask):  # gaescan on the Dask arrays, or its references on NumPy's
        return (
            lib.discounted_returns(r, gamma=0.9, last_value=lv),
            lib.linear_scan(0.9, r, reverse=True, initial=lv),
            lib.linear_scan(0.9, r, initial=lv),
            lib.gae(r, v, gamma=0.9, lam=0.9, last_advantage=lv).advantages,
            lib.gae(r, v, gamma=g8, lam=1.0, mask=mask, last_value=0.1).advantages,
            lib.vtrace(r, v, r * 0, gamma=0.9, lam=0.9, last_value=lv).vs,
        )

    got, want = compute(*calls(gaescan, R, V, M)), calls(gt, r, v, mask)
    for x, y in zip(got, want, strict=True):
        gt.assert_close(x, y, dtype=np.float64)


@pytest.mark.cudasim
def test_errors(rng):
    R = da.from_array(random_data(rng, (B, T)), chunks=(3, 20))
    with pytest.raises(TypeError, match="out="):
        gaescan.gae(R, R, gamma=0.9, lam=0.9, out=(np.empty((B, T)), np.empty((B, T))))
    with pytest.raises(TypeError, match="out="):
        gaescan.linear_scan(0.5, R, out=da.zeros((B, T), chunks=3))
    with pytest.raises(ValueError, match="cu_seqlens"):
        gaescan.discounted_returns(R[0], gamma=0.9, cu_seqlens=np.array([0, 10, T]))
    with pytest.raises(ValueError, match="shape"):
        gaescan.gae(R, R[:, :10], gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="dones"):
        gaescan.gae(R, R, gamma=0.9, lam=0.9, dones=R > 0, terminated=R > 0)
    with pytest.raises(ValueError, match="truncated needs next_values"):
        gaescan.gae(R, R, gamma=0.9, lam=0.9, truncated=R > 0)
    with pytest.raises(ValueError, match="exclusive"):
        gaescan.gae(R, R, gamma=0.9, lam=0.9, next_values=R, last_value=1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        gaescan.discounted_returns(R, gamma=1.5)
    with pytest.raises(ValueError, match="broadcast"):
        gaescan.discounted_returns(R, gamma=np.ones((B, 2)))
    with pytest.raises(ValueError, match="last_value"):
        gaescan.discounted_returns(R, gamma=0.9, last_value=np.ones(B + 1))
    with pytest.raises(ValueError, match="backend"):
        gaescan.discounted_returns(R, gamma=0.9, backend="gpu")
    if not cuda_simulator():  # the simulator runs backend='cuda' on host chunks
        with pytest.raises(TypeError, match="backend='cuda'"):
            gaescan.discounted_returns(R, gamma=0.9, backend="cuda")
    with pytest.raises(TypeError, match="reverse"):
        gaescan.linear_scan(0.5, R, reverse="no")
    with pytest.raises(ValueError, match="axis"):
        gaescan.linear_scan(0.5, R, axis=2)
    with pytest.raises(TypeError, match="real numbers"):
        gaescan.linear_scan(0.5, R.astype("U3"))


def test_torch_mixed_with_dask_is_a_type_error(rng):
    torch = pytest.importorskip("torch")
    R = da.from_array(random_data(rng, (B, T)), chunks=(3, 20))
    with pytest.raises(TypeError, match="PyTorch"):
        gaescan.gae(R, torch.zeros(B, T), gamma=0.9, lam=0.9)
    with pytest.raises(TypeError, match="'mask' is a PyTorch tensor"):
        gaescan.whiten(R, torch.ones(B, T, dtype=torch.bool))
    with pytest.raises(TypeError, match="'mask' is a PyTorch tensor"):
        gaescan.moments(R, torch.ones(B, T, dtype=torch.bool))
    with pytest.raises(TypeError, match="'x' is a PyTorch tensor"):
        gaescan.whiten(torch.ones(B, T), da.ones((B, T), chunks=2, dtype=bool))
    with pytest.raises(TypeError, match="'groups' is a PyTorch tensor"):
        gaescan.group_normalize(da.ones(4, chunks=2), groups=torch.zeros(4, dtype=torch.long))


def test_group_size_of_scores_of_unknown_length():
    s = da.from_array(np.arange(6.0), chunks=4)
    s = s[s >= 0]  # shape (nan,)
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        gaescan.group_normalize(s, group_size=3)
    got = gaescan.group_normalize(s.compute_chunk_sizes(), group_size=3)
    assert_close(compute(got)[0], gt.group_normalize(np.arange(6.0), group_size=3), np.float64)


def test_in_memory_functions_point_to_the_public_ones(rng):
    R = da.from_array(random_data(rng, (B, T)), chunks=(3, 20))
    with pytest.raises(TypeError, match="Dask"):
        gaescan.returns_summary(R, gamma=0.9)


# ------------------------------------------------------------ distributed


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, memory_limit="2GiB",
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_distributed_gae(client, rng):
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d, m = random_flags(rng, (B, T), 0.1), random_flags(rng, (B, T), 0.7)
    m[:, 31:60] = False
    chunks = CHUNKINGS["ragged"]
    adv, ret = gaescan.gae(da.from_array(r, chunks=chunks), da.from_array(v, chunks=chunks), gamma=0.99,
                           lam=0.95, dones=da.from_array(d, chunks=chunks), mask=m, last_value=np.ones(B, np.float32))
    a, b = client.compute([adv, ret], sync=True)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m, last_value=np.ones(B, np.float32))
    assert_close(a, ref[0], np.float32)
    assert_close(b, ref[1], np.float32)
    mem = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m, last_value=np.ones(B, np.float32))
    gt.assert_close(a, mem.advantages, dtype=np.float32)


def test_distributed_time_major_next_values(client, rng):
    shape = (T, B)
    r, v, nv = (random_data(rng, shape, np.float64) for _ in range(3))
    term, trunc = random_flags(rng, shape, 0.05), random_flags(rng, shape, 0.05)
    chunks = ((7, 20, 40), (2, 4))
    D = {k: da.from_array(x, chunks=chunks) for k, x in dict(r=r, v=v, nv=nv, te=term, tr=trunc).items()}
    adv, _ = gaescan.gae(D["r"], D["v"], gamma=0.99, lam=0.95, next_values=D["nv"], terminated=D["te"],
                         truncated=D["tr"], last_advantage=0.5, axis=0)
    (a,) = client.compute([adv], sync=True)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, next_values=nv, terminated=term, truncated=trunc,
                         last_advantage=0.5, axis=0)
    assert_close(a, ref[0], np.float64)


def test_distributed_returns_and_forward_scan(client, rng):
    r = random_data(rng, (B, T))
    d = random_flags(rng, (B, T), 0.1)
    chunks = CHUNKINGS["even"]
    G = gaescan.discounted_returns(da.from_array(r, chunks=chunks), gamma=0.97, dones=d, last_value=1.0)
    y = gaescan.linear_scan(0.9, da.from_array(r, chunks=chunks), initial=np.ones(B, np.float32))
    g, yy = client.compute([G, y], sync=True)
    assert_close(g, gt.discounted_returns(r, gamma=0.97, dones=d, last_value=1.0), np.float32)
    assert_close(yy, gt.linear_scan(0.9, r, initial=np.ones(B, np.float32)), np.float32)


def test_the_functions_named_as_taking_dask_arrays_take_them():
    # The refusal of every other function names these (gaescan._arrays.DASK_FUNCTIONS).
    from gaescan import _arrays

    x = da.from_array(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), chunks=(2, 16))
    calls = {
        "gae": lambda: gaescan.gae(x, x, gamma=0.9, lam=0.9),
        "discounted_returns": lambda: gaescan.discounted_returns(x, gamma=0.9),
        "linear_scan": lambda: gaescan.linear_scan(0.9, x),
        "vtrace": lambda: gaescan.vtrace(x, x, x * 0, gamma=0.9, lam=1.0),
        "group_normalize": lambda: gaescan.group_normalize(x[:, 0], group_size=2),
        "moments": lambda: gaescan.moments(x),
        "whiten": lambda: gaescan.whiten(x),
        "turn_gae": lambda: gaescan.turn_gae(x, x, (x > 0).astype(np.int32).cumsum(axis=1), gamma=0.9, lam=0.9),
    }
    assert sorted(_arrays.DASK_FUNCTIONS) == sorted(calls)
    for name, f in calls.items():
        res = f()
        parts = res if isinstance(res, tuple) else (res,)
        assert parts and all(dask.is_dask_collection(p) for p in parts), name
    with pytest.raises(TypeError, match="gaescan.gae, gaescan.discounted_returns.*compute them first"):
        gaescan.gae_summary(x, x, gamma=0.9, lam=0.9)
