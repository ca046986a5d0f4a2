"""gaescan.vtrace on Dask arrays: time blocks carry the bootstrap and the trace.

Every chunking of ``test_dask.py`` (ragged, one step per chunk, empty chunks,
time-major), every flag mode, masks with whole chunks masked, per-step γ and
per-row λ, clipping, both boundaries; compared with the float64 reference of
``gaescan.testing`` and with the in-memory call.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import flag_kwargs, random_data, random_flags
from test_dask import CHUNKINGS, B, T, check, chunked, compute, shape_for

import gaescan
import gaescan.testing as gt

da = pytest.importorskip("dask.array")


def _log_rhos(rng, shape, dtype=np.float32):
    return (0.7 * rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("flags", ["none", "dones", "term+trunc"])
def test_vtrace_chunkings(rng, chunking, axis, flags):
    shape = shape_for(axis)
    r, v, lr = random_data(rng, shape), random_data(rng, shape), _log_rhos(rng, shape)
    kw = flag_kwargs(flags, rng, shape, v)
    if "next_values" not in kw:
        kw["last_value"] = random_data(rng, (B,))
    kw["last_trace"] = random_data(rng, (B,))
    chunks = CHUNKINGS[chunking]
    dkw = {k: chunked(x, chunks, axis) if isinstance(x, np.ndarray) and x.shape == shape else x
           for k, x in kw.items()}
    Rd, Vd, Ld = (chunked(x, chunks, axis) for x in (r, v, lr))
    vs, adv = gaescan.vtrace(Rd, Vd, Ld, gamma=0.99, lam=0.95, c_bar=0.9, axis=axis, **dkw)
    ref = gt.vtrace(r, v, lr, gamma=0.99, lam=0.95, c_bar=0.9, axis=axis, **kw)
    mem = gaescan.vtrace(r, v, lr, gamma=0.99, lam=0.95, c_bar=0.9, axis=axis, **kw)
    got = check(vs, ref[0], np.float32, Rd.chunks)
    check(adv, ref[1], np.float32, Rd.chunks)
    gt.assert_close(got, mem.vs, dtype=np.float32)


@pytest.mark.parametrize("chunking", ["ragged", "steps-of-one", "empty-chunks"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vtrace_every_feature(rng, chunking, dtype):
    """Terminations, a mask with whole chunks masked, per-step γ, per-row λ, thresholds, NaN at masked steps."""
    shape = (B, T)
    chunks = CHUNKINGS[chunking]
    r, v, lr = random_data(rng, shape, dtype), random_data(rng, shape, dtype), _log_rhos(rng, shape, dtype)
    term = random_flags(rng, shape, 0.08, np.int8)
    m = random_flags(rng, shape, 0.7)
    m[:, 31:60] = False
    r[~m] = np.nan  # masked positions are never read
    lr[~m] = np.nan
    gamma = rng.uniform(0.9, 1.0, shape).astype(dtype)
    lam = rng.uniform(0.5, 1.0, (B, 1)).astype(dtype)
    kw = dict(gamma=gamma, lam=lam, rho_bar=1.5, c_bar=0.8, pg_rho_bar=1.2, terminated=term, mask=m,
              last_value=random_data(rng, (B,), dtype), last_trace=random_data(rng, (B,), dtype))
    dkw = dict(kw, gamma=da.from_array(gamma, chunks=5), terminated=da.from_array(term, chunks=chunks),
               last_value=da.from_array(kw["last_value"], chunks=4))
    Rd, Vd, Ld = (da.from_array(x, chunks=chunks) for x in (r, v, lr))
    vs, adv = gaescan.vtrace(Rd, Vd, Ld, **dkw)
    ref = gt.vtrace(r, v, lr, **kw)
    got = check(vs, ref[0], dtype, Rd.chunks)
    check(adv, ref[1], dtype, Rd.chunks)
    assert np.all(got[~m] == 0)


def test_vtrace_nan_beyond_done_across_chunks(rng):
    r, v, lr = (random_data(rng, (B, T), np.float64) for _ in range(3))
    d = np.zeros((B, T), bool)
    d[:, 29] = True
    r[:, 30:] = np.nan
    lr[:, 30:] = np.nan
    chunks = ((3, 3), (10, 20, 1, 36))
    vs, adv = gaescan.vtrace(*(da.from_array(x, chunks=chunks) for x in (r, v, lr)), gamma=0.99, dones=d)
    got_vs, got_adv = compute(vs, adv)
    for got, want in ((got_vs, gt.vtrace(r, v, lr, gamma=0.99, dones=d)[0]),
                      (got_adv, gt.vtrace(r, v, lr, gamma=0.99, dones=d)[1])):
        assert np.all(np.isfinite(got[:, :30])) and np.all(np.isnan(got[:, 30:]))
        gt.assert_close(got, want, dtype=np.float64)


def test_vtrace_is_lazy_and_refuses_what_it_cannot_do(rng):
    r = da.from_array(random_data(rng, (B, T)), chunks=(3, 10))
    vs, adv = gaescan.vtrace(r, r, r, gamma=0.9)
    assert isinstance(vs, da.Array) and vs.chunks == r.chunks
    with pytest.raises(TypeError, match="out= is not supported with Dask"):
        gaescan.vtrace(r, r, r, gamma=0.9, out=(np.empty((B, T)), np.empty((B, T))))
    with pytest.raises(ValueError, match="rho_bar"):
        gaescan.vtrace(r, r, r, gamma=0.9, rho_bar=-1.0)
    with pytest.raises(ValueError, match="cu_seqlens is not supported with Dask"):
        gaescan.vtrace(r[0], r[0], r[0], gamma=0.9, cu_seqlens=np.array([0, T]))
