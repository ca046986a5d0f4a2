"""gaescan.turn_gae on Dask arrays: turns that span time blocks.

Every chunking of ``test_dask.py`` (ragged, one step per chunk, empty chunks,
time-major), with and without masks (masked spans inside and between turns,
whole blocks masked), per-row coefficients and boundaries as Dask arrays,
N-d batches, id dtypes, NaN isolation, and the errors, found when the blocks
are computed where they read the ids; compared with the float64 reference of
``gaescan.testing`` and with the in-memory call.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_unchanged, assert_zero_where, random_data, snapshot
from test_dask import CHUNKINGS, B, T, check, chunked, compute
from test_turn_gae import conversation, six_turns

import gaescan
import gaescan.testing as gt

da = pytest.importorskip("dask.array")


def _case(rng, dtype=np.float32, shape=(B, T), **conv):
    ids, mask = conversation(rng, shape[0], shape[1], **conv)
    return dict(rewards=random_data(rng, shape, dtype), values=random_data(rng, shape, dtype), turn_ids=ids,
                mask=mask, gamma=0.99, lam=0.95, last_value=random_data(rng, (shape[0],), dtype))


def _run(kw, chunks, axis=-1, **dask_kw):
    """turn_gae with the (B, T) arrays of ``kw`` as Dask arrays of ``chunks``; both outputs
    checked against the reference (and their chunks); returns the computed pair."""
    snap = snapshot(kw)
    dkw = {k: chunked(x, chunks, axis) if isinstance(x, np.ndarray) and x.shape == kw["rewards"].shape else x
           for k, x in kw.items()}
    dkw.update(dask_kw)
    res = gaescan.turn_gae(**dkw, axis=axis)
    assert isinstance(res, gaescan.GAEResult)
    ref = gt.turn_gae(**kw, axis=axis)
    dtype = gt.result_dtype(kw["rewards"], kw["values"], kw.get("last_value"), kw["gamma"], kw["lam"])
    adv = check(res.advantages, ref.advantages, dtype, dkw["rewards"].chunks)
    ret = check(res.returns, ref.returns, dtype, dkw["rewards"].chunks)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(adv, kw["mask"])
        assert_zero_where(ret, kw["mask"])
    return adv, ret


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("masked", [True, False])
def test_chunkings(rng, chunking, axis, masked):
    kw = _case(rng) if masked else dict(_case(rng, spans=0), mask=None)
    if axis == 0:
        kw = {k: (x.T.copy() if isinstance(x, np.ndarray) and x.ndim == 2 else x) for k, x in kw.items()}
    adv, _ = _run(kw, CHUNKINGS[chunking], axis)
    mem = gaescan.turn_gae(**kw, axis=axis)
    gt.assert_close(adv, mem.advantages, dtype=np.float32)


@pytest.mark.parametrize("chunking", ["even", "steps-of-one", "empty-chunks"])
def test_turns_across_blocks(rng, chunking):
    """One turn over every block; a turn whose middle block is all masked; a row whose
    first valid token lies in its last block; a row with no valid token."""
    kw = _case(rng, np.float64)
    ids, mask = kw["turn_ids"], kw["mask"]
    ids[0], mask[0] = 7, True
    ids[1] = np.where(np.arange(T) < 40, 2, 5)
    mask[1] = True
    mask[1, 12:33] = False
    mask[2] = False
    mask[2, 61:] = True
    ids[2, 61:] = [0, 0, 1, 1, 1, 9]
    mask[3] = False
    _run(kw, CHUNKINGS[chunking])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_coefficients_boundaries_and_batch_axes(rng, dtype):
    """Per-row γ as a Dask array, per-row λ in NumPy, ``last_value`` as a Dask array,
    an N-d batch, and ids of a narrow unsigned dtype."""
    B1, B2, TT = 2, 3, 50
    kw = _case(rng, dtype, (B1 * B2, TT))
    kw = {k: (x.reshape(B1, B2, -1) if isinstance(x, np.ndarray) and x.ndim >= 1 and x.shape[0] == B1 * B2
              else x) for k, x in kw.items()}
    kw["last_value"] = kw["last_value"].reshape(B1, B2)
    kw["turn_ids"] = np.where(kw["mask"], kw["turn_ids"], 0).astype(np.uint8)
    kw["gamma"] = rng.uniform(0.8, 1.0, (B1, B2, 1)).astype(dtype)
    kw["lam"] = rng.uniform(0.5, 1.0, (B2, 1)).astype(dtype)
    chunks = ((1, 1), (2, 1), (7, 30, 13))
    _run(kw, chunks, gamma=da.from_array(kw["gamma"], chunks=(1, 2, 1)),
         last_value=da.from_array(kw["last_value"], chunks=(1, 2)))


def test_masked_tokens_are_not_read_and_nan_stays_in_its_turns(rng):
    kw = six_turns(rng)
    ids, mask = kw["turn_ids"], kw["mask"]
    Bn = ids.shape[0]
    chunks = ((2, 2), (45, 45, 45, 45, 45, 45, 30))

    def run(**over):
        d = {**kw, **over}
        d = {k: (da.from_array(x, chunks=chunks) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
             for k, x in d.items()}
        return compute(*gaescan.turn_gae(**d))

    clean = run()
    r, v, bad_ids = kw["rewards"].copy(), kw["values"].copy(), ids.copy()
    r[:, 125] = v[:, 125] = np.nan
    v[:, 51] = np.inf
    bad_ids[:, 120:130] = -7
    for got, want in zip(run(rewards=r, values=v, turn_ids=bad_ids), clean, strict=True):
        np.testing.assert_array_equal(got, want)
    # A NaN reward in turn 3 of row 1: that turn and earlier turns of row 1 only.
    r = kw["rewards"].copy()
    r[1, 170] = np.nan
    adv, ret = run(rewards=r)
    others = np.arange(Bn) != 1
    np.testing.assert_array_equal(adv[others], clean[0][others])
    later = ids[1] >= 4
    np.testing.assert_array_equal(adv[1, later], clean[0][1, later])
    np.testing.assert_array_equal(ret[1, later], clean[1][1, later])
    assert np.all(np.isnan(adv[1, (ids[1] <= 3) & mask[1]]))
    assert_zero_where(adv, mask)


def test_errors(rng):
    kw = _case(rng, shape=(3, 20))
    chunks = ((2, 1), (6, 6, 8))

    def dask_kw(**over):
        return {k: (da.from_array(x, chunks=chunks) if isinstance(x, np.ndarray) and x.ndim == 2 else x)
                for k, x in {**kw, **over}.items()}

    with pytest.raises(TypeError, match="turn_ids.*integer"):
        gaescan.turn_gae(**dask_kw(turn_ids=kw["turn_ids"].astype(np.float32)))
    with pytest.raises(TypeError, match="out= is not supported with Dask arrays"):
        gaescan.turn_gae(**dask_kw(), out=(np.empty((3, 20)), np.empty((3, 20))))
    with pytest.raises(ValueError, match="gamma.*varies along the time axis"):
        gaescan.turn_gae(**dask_kw(gamma=np.full((3, 20), 0.9)))
    with pytest.raises(ValueError, match="lam"):
        gaescan.turn_gae(**dask_kw(lam=-0.1))
    with pytest.raises(ValueError, match=r"'values' has shape \(3, 19\).*'rewards' has shape \(3, 20\)"):
        gaescan.turn_gae(**{**dask_kw(), "values": kw["values"][:, 1:]})
    # Ids that decrease at valid tokens, across a block boundary and a masked span of row 1:
    # found when the blocks are computed, naming the row (and the batch index of an N-d batch).
    ids = np.broadcast_to(np.arange(20) // 5, (3, 20)).copy()
    mask = np.ones((3, 20), bool)
    mask[1, 10:13] = False
    ok = dict(turn_ids=ids, mask=mask)
    compute(*gaescan.turn_gae(**dask_kw(**ok)))
    bad = ids.copy()
    bad[1, 13:] = 0
    res = gaescan.turn_gae(**dask_kw(turn_ids=bad, mask=mask))
    with pytest.raises(ValueError, match=r"turn_ids.*non-decreasing.*row 1"):
        compute(*res)
    nd = {k: x.reshape(3, 1, 20) for k, x in dask_kw(turn_ids=bad, mask=mask).items()
          if hasattr(x, "ndim") and x.ndim == 2}
    with pytest.raises(ValueError, match=r"row 1 \(batch index \(1, 0\)\)"):
        compute(*gaescan.turn_gae(**nd, gamma=0.9, lam=0.9))
    # The same decrease at a masked token is not read.
    mask2 = mask.copy()
    mask2[1, 13:] = False
    compute(*gaescan.turn_gae(**dask_kw(turn_ids=bad, mask=mask2)))
    big = ids.astype(np.int64)
    big[0, 10:] = 2 ** 60
    with pytest.raises(ValueError, match=r"turn_ids.*2\^53"):
        compute(*gaescan.turn_gae(**dask_kw(turn_ids=big)))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="'values' is a PyTorch tensor"):
        gaescan.turn_gae(**{**dask_kw(), "values": torch.from_numpy(kw["values"])})


def test_zero_size():
    x = da.zeros((3, 0), dtype=np.float32, chunks=(2, 1))
    adv, ret = gaescan.turn_gae(x, x, da.zeros((3, 0), dtype=np.int32, chunks=(2, 1)), gamma=0.9, lam=0.9)
    assert adv.shape == ret.shape == (3, 0) and adv.dtype == ret.dtype == np.float32
    assert compute(adv)[0].shape == (3, 0)
