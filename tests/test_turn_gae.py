"""gaescan.turn_gae against the float64 reference gaescan.testing.turn_gae, on the CPU
backends: turn lengths, masked tool-observation spans, rows without valid tokens,
coefficient and boundary forms, axes, dtypes, id dtypes, NaN isolation, out=, torch
tensors and errors; and CuPy arrays on the "cuda" backend where a GPU is present."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import assert_close, assert_unchanged, assert_zero_where, random_data, snapshot

import gaescan
import gaescan.testing as gt

BACKENDS = ["numba", "numpy"]
TG_LENGTHS = [1, 2, 31, 32, 33, 127, 128, 129, 1000]


def conversation(rng, B, T, *, turns=None, spans=3, garbage=True):
    """``(turn_ids, mask)`` of ``B`` conversations of ``T`` tokens.

    Each row is cut into ``turns`` runs (random, 1..12, when ``None``) with
    increasing ids that skip values; up to ``spans`` random masked spans (tool
    observations, prompts) fall inside and between turns.  Masked tokens get
    arbitrary ids (``garbage``), which are never read.
    """
    ids = np.empty((B, T), dtype=np.int64)
    mask = np.ones((B, T), dtype=bool)
    for b in range(B):
        k = turns if turns is not None else int(rng.integers(1, min(T, 12) + 1))
        k = min(k, T)
        cuts = np.sort(rng.choice(np.arange(1, T), size=k - 1, replace=False)) if k > 1 else []
        seg = np.zeros(T, dtype=np.int64)
        seg[cuts] = 1
        seg = np.cumsum(seg)
        gaps = rng.integers(1, 4, size=k)
        ids[b] = (np.cumsum(gaps) + int(rng.integers(0, 3)))[seg]
        for _ in range(int(rng.integers(0, spans + 1))):
            s = int(rng.integers(0, T))
            mask[b, s:s + int(rng.integers(1, max(2, T // 4)))] = False
    if garbage:
        ids[~mask] = rng.integers(-5, 100, size=int((~mask).sum()))
    return ids, mask


def check(backend, dtype=None, **kw):
    """Run turn_gae on ``backend`` and compare both outputs with the reference."""
    snap = snapshot(kw)
    res = gaescan.turn_gae(**kw, backend=backend)
    assert isinstance(res, gaescan.GAEResult)
    ref = gt.turn_gae(**kw)
    if dtype is None:
        dtype = gt.result_dtype(kw["rewards"], kw["values"], kw.get("last_value"), kw["gamma"], kw["lam"])
    assert_close(res.advantages, ref.advantages, dtype)
    assert_close(res.returns, ref.returns, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(res.advantages, kw["mask"])
        assert_zero_where(res.returns, kw["mask"])
    return res


def case(rng, B, T, dtype=np.float32, **conv):
    ids, mask = conversation(rng, B, T, **conv)
    return dict(rewards=random_data(rng, (B, T), dtype), values=random_data(rng, (B, T), dtype),
                turn_ids=ids, mask=mask, gamma=0.99, lam=0.95,
                last_value=random_data(rng, (B,), dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_computed(backend):
    # prompt (masked) | turn 0: two tokens | tool observation (masked) | turn 1: two tokens
    r = np.array([9.0, 1.0, 2.0, 9.0, 0.0, 3.0])
    v = np.array([9.0, 0.5, 9.0, 9.0, 1.0, 9.0])
    ids = np.array([-1, 0, 0, -1, 1, 1])
    mask = np.array([0, 1, 1, 0, 1, 1], dtype=bool)
    adv, ret = gaescan.turn_gae(r, v, ids, gamma=0.5, lam=0.5, mask=mask, last_value=2.0, backend=backend)
    # turn 1: R = 3, U = 1:   A = 3 + 0.5·2 − 1 = 3
    # turn 0: R = 3, U = 0.5: A = 3 + 0.5·1 − 0.5 + 0.25·3 = 3.75
    np.testing.assert_array_equal(adv, [0.0, 3.75, 3.75, 0.0, 3.0, 3.0])
    np.testing.assert_array_equal(ret, [0.0, 4.25, 4.25, 0.0, 4.0, 4.0])
    assert adv.dtype == np.float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", TG_LENGTHS)
def test_lengths(backend, rng, T):
    check(backend, **case(rng, 5, T))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 33, 129])
def test_float64(backend, rng, T):
    res = check(backend, **case(rng, 4, T, dtype=np.float64))
    assert res.advantages.dtype == np.float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 7, 128, 129])
def test_one_token_turns_are_token_gae(backend, rng, T):
    # Every valid token its own turn: turn-level GAE is the masked token-level GAE.
    kw = case(rng, 3, T)
    kw["turn_ids"] = np.broadcast_to(np.arange(T), (3, T)).copy()
    res = check(backend, **kw)
    ref = gt.gae(kw["rewards"], kw["values"], gamma=0.99, lam=0.95, mask=kw["mask"],
                 last_value=kw["last_value"])
    assert_close(res.advantages, ref.advantages, np.float32)
    assert_close(res.returns, ref.returns, np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 2, 129, 1000])
def test_one_turn_per_row(backend, rng, T):
    kw = case(rng, 4, T, turns=1, spans=0)
    res = check(backend, **kw)
    r, v = kw["rewards"].astype(np.float64), kw["values"].astype(np.float64)
    g = np.float64(np.float32(0.99))
    want = r.sum(axis=1) + g * kw["last_value"].astype(np.float64) - v[:, 0]
    assert_close(res.advantages, np.broadcast_to(want[:, None], r.shape), np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_without_valid_tokens(backend, rng):
    kw = case(rng, 4, 65)
    kw["mask"][1] = False
    kw["mask"][3] = False
    res = check(backend, **kw)
    assert np.all(res.advantages[[1, 3]] == 0) and np.all(res.returns[[1, 3]] == 0)
    kw["mask"][:] = False
    res = check(backend, **kw)
    assert np.all(res.advantages == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_spans_inside_and_between_turns(backend, rng):
    T = 200
    kw = case(rng, 6, T, turns=5, spans=8)
    check(backend, **kw)
    # A masked span inside a turn splits nothing: the turn's tokens on both sides share A_k.
    ids = np.repeat([0, 1, 2, 3], 50)[None].repeat(2, axis=0)
    mask = np.ones((2, T), dtype=bool)
    mask[:, 10:20] = False    # inside turn 0
    mask[:, 95:105] = False   # across the boundary of turns 1 and 2
    mask[0, 150:200] = False  # all of turn 3 of row 0
    kw.update(rewards=kw["rewards"][:2], values=kw["values"][:2], last_value=kw["last_value"][:2],
              turn_ids=ids, mask=mask)
    res = check(backend, **kw)
    for b in range(2):
        for k in range(4):
            a = res.advantages[b][(ids[b] == k) & mask[b]]
            assert a.size == 0 or np.all(a == a[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_coefficients_and_boundaries(backend, rng):
    B, T = 7, 129
    kw = case(rng, B, T)
    kw["gamma"] = rng.uniform(0.5, 1.0, (B, 1)).astype(np.float32)
    kw["lam"] = rng.uniform(0.0, 1.0, (B, 1)).astype(np.float32)
    check(backend, **kw)
    kw["last_value"] = 0.7
    check(backend, **kw)
    del kw["last_value"]
    kw["gamma"], kw["lam"] = 1.0, 0.0
    check(backend, **kw)
    kw["gamma"] = np.float32(0.9999999)
    kw["lam"] = np.full((B,), 0.5)[:, None]  # float64 λ: a float64 result
    check(backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_major(backend, rng):
    B, T = 5, 129
    kw = case(rng, B, T)
    res = gaescan.turn_gae(**kw, backend=backend)
    tm = {k: (x.T.copy() if isinstance(x, np.ndarray) and x.ndim == 2 else x) for k, x in kw.items()}
    tm["gamma"] = np.full((1, B), 0.99)
    tm["gamma"] = tm["gamma"].astype(np.float32)
    out = check(backend, axis=0, **tm)
    np.testing.assert_array_equal(out.advantages, res.advantages.T)
    np.testing.assert_array_equal(out.returns, res.returns.T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_axes(backend, rng):
    kw = case(rng, 6, 40)
    flat = gaescan.turn_gae(**kw, backend=backend)
    nd = {k: (x.reshape((2, 3) + x.shape[1:]) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    res = check(backend, **nd)
    np.testing.assert_array_equal(res.advantages.reshape(6, 40), flat.advantages)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_row_64_turns(backend, rng):
    T = 32768
    kw = case(rng, 2, T, turns=64, spans=20)
    check(backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("id_dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
def test_id_dtypes(backend, rng, id_dtype):
    kw = case(rng, 3, 61, garbage=False)
    want = gaescan.turn_gae(**kw, backend=backend)
    kw["turn_ids"] = kw["turn_ids"].astype(id_dtype)
    res = check(backend, **kw)
    np.testing.assert_array_equal(res.advantages, want.advantages)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_dtypes_and_strides(backend, rng):
    kw = case(rng, 4, 100)
    kw["rewards"] = kw["rewards"].astype(np.float16)
    kw["values"] = np.asfortranarray(kw["values"])
    kw["mask"] = kw["mask"].astype(np.int32)
    kw["turn_ids"] = kw["turn_ids"][:, ::-1].copy()[:, ::-1]  # negative strides
    check(backend, **kw)


def six_turns(rng):
    """Four rows of six 50-token turns (ids 0..5), tokens 120..129 (inside turn 2) masked:
    the arguments of the NaN-isolation tests."""
    B, T = 4, 300
    ids = np.repeat(np.arange(6), 50)[None].repeat(B, axis=0)
    mask = np.ones((B, T), dtype=bool)
    mask[:, 120:130] = False
    return dict(rewards=random_data(rng, (B, T)), values=random_data(rng, (B, T)), turn_ids=ids, mask=mask,
                gamma=0.99, lam=0.95, last_value=random_data(rng, (B,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_isolation(backend, rng):
    kw = six_turns(rng)
    ids, mask = kw["turn_ids"], kw["mask"]
    B = ids.shape[0]
    clean = gaescan.turn_gae(**kw, backend=backend)
    # NaN at masked tokens and at values other than a turn's first: never read.
    r, v = kw["rewards"].copy(), kw["values"].copy()
    r[:, 125] = v[:, 125] = np.nan
    v[:, 51] = np.inf
    res = gaescan.turn_gae(**{**kw, "rewards": r, "values": v}, backend=backend)
    np.testing.assert_array_equal(res.advantages, clean.advantages)
    np.testing.assert_array_equal(res.returns, clean.returns)
    # A NaN reward in turn 3 of row 1: that turn and earlier turns of row 1 only.
    r = kw["rewards"].copy()
    r[1, 170] = np.nan
    res = gaescan.turn_gae(**{**kw, "rewards": r}, backend=backend)
    others = np.arange(B) != 1
    np.testing.assert_array_equal(res.advantages[others], clean.advantages[others])
    later = ids[1] >= 4
    np.testing.assert_array_equal(res.advantages[1, later], clean.advantages[1, later])
    np.testing.assert_array_equal(res.returns[1, later], clean.returns[1, later])
    assert np.all(np.isnan(res.advantages[1, (ids[1] <= 3) & mask[1]]))
    assert_zero_where(res.advantages, mask)
    # An inf or NaN value at the first token of turn 4 of row 2: U_4 is read by
    # turns 3 (as U_{k+1}) and 4; returns there are not finite either.
    for bad_value in (np.inf, np.nan):
        v = kw["values"].copy()
        v[2, 200] = bad_value
        res = gaescan.turn_gae(**{**kw, "values": v}, backend=backend)
        not2 = np.arange(B) != 2
        np.testing.assert_array_equal(res.advantages[not2], clean.advantages[not2])
        later = ids[2] >= 5
        np.testing.assert_array_equal(res.advantages[2, later], clean.advantages[2, later])
        np.testing.assert_array_equal(res.returns[2, later], clean.returns[2, later])
        hit = (ids[2] <= 4) & mask[2]
        assert not np.any(np.isfinite(res.advantages[2, hit]))
        assert not np.any(np.isfinite(res.returns[2, (ids[2] == 4) & mask[2]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out(backend, rng):
    kw = case(rng, 3, 50)
    adv, ret = np.full((3, 50), 7.0, np.float32), np.full((3, 50), 7.0, np.float32)
    res = gaescan.turn_gae(**kw, out=(adv, ret), backend=backend)
    assert res.advantages is adv and res.returns is ret
    ref = gt.turn_gae(**kw)
    assert_close(adv, ref.advantages, np.float32)
    assert_close(ret, ref.returns, np.float32)
    with pytest.raises(ValueError, match="out"):
        gaescan.turn_gae(**kw, out=(adv, np.empty((3, 50))), backend=backend)
    with pytest.raises(ValueError, match="overlaps"):
        gaescan.turn_gae(**{**kw, "rewards": adv}, out=(adv, ret), backend=backend)


def _placed_rows(R, T, dtype, offset):
    """A NaN-filled ``(R, T)`` array of ``dtype`` whose data starts ``offset``
    items past a 64-byte line (rows ``T`` items apart)."""
    size = np.dtype(dtype).itemsize
    buf = np.full(R * T + 128 // size, np.nan, dtype)
    skip = (-buf.__array_interface__["data"][0] % 64) // size + offset
    return buf[skip:skip + R * T].reshape(R, T)


# Outputs of numba_cpu.STREAM_MIN_BYTES and up: the whole 64-byte lines of each
# turn's span are written by non-temporal stores, the elements around them by
# ordinary stores.  Rows of 203 items start at nine offsets within a line,
# turns are 1 to 200 tokens long, and the two outputs start at different
# offsets: the bits must be those of ordinary stores.
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 6), (7, 3), (5, 2)])
def test_streamed_spans_give_the_bits_of_ordinary_stores(rng, monkeypatch, dtype, masked, offsets):
    from gaescan.backends import numba_cpu, turn_gae_numba

    R, T = 9, 203
    kw = case(rng, R, T, dtype=dtype, turns=None if masked else 40, spans=4, garbage=masked)
    if not masked:
        kw["mask"] = None
    kw["rewards"][3, 50] = np.nan  # reaches its turn and the turns before it in row 3, no other row
    plain = gaescan.turn_gae(**kw, backend="numba")
    streamed = []
    real = turn_gae_numba._stream
    monkeypatch.setattr(turn_gae_numba, "_stream", lambda a, b: streamed.append(real(a, b)) or streamed[-1])
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    out = tuple(_placed_rows(R, T, dtype, o) for o in offsets)
    res = gaescan.turn_gae(**kw, backend="numba", out=out)
    assert streamed == [True]
    for got, want in zip(res, plain, strict=True):
        assert np.array_equal(got, want, equal_nan=True)
    ref = gt.turn_gae(**kw)
    ok = np.ones((R, T), bool)
    ok[3] = False
    assert_close(res.advantages[ok], ref.advantages[ok], dtype)
    assert_close(res.returns[ok], ref.returns[ok], dtype)


def test_auto_is_numba(rng):
    kw = case(rng, 3, 40)
    a = gaescan.turn_gae(**kw)
    b = gaescan.turn_gae(**kw, backend="numba")
    np.testing.assert_array_equal(a.advantages, b.advantages)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_cpu(backend, rng):
    torch = pytest.importorskip("torch")
    kw = case(rng, 3, 40)
    tkw = {k: (torch.from_numpy(x) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    res = gaescan.turn_gae(**tkw, backend=backend)
    assert isinstance(res.advantages, torch.Tensor) and res.advantages.dtype == torch.float32
    ref = gt.turn_gae(**kw)
    assert_close(res.advantages.numpy(), ref.advantages, np.float32)
    assert_close(res.returns.numpy(), ref.returns, np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size(backend):
    for shape in [(0, 5), (3, 0)]:
        z = np.zeros(shape, np.float32)
        adv, ret = gaescan.turn_gae(z, z, np.zeros(shape, np.int32), gamma=0.9, lam=0.9, backend=backend)
        assert adv.shape == shape and ret.dtype == np.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors(backend, rng):
    kw = case(rng, 3, 20)
    with pytest.raises(TypeError, match="turn_ids.*integer"):
        gaescan.turn_gae(**{**kw, "turn_ids": kw["turn_ids"].astype(np.float32)}, backend=backend)
    with pytest.raises(TypeError, match="turn_ids.*integer"):
        gaescan.turn_gae(**{**kw, "turn_ids": kw["turn_ids"] > 0}, backend=backend)
    with pytest.raises(TypeError, match="turn_ids"):
        gaescan.turn_gae(**{**kw, "turn_ids": 3}, backend=backend)
    # decreasing ids at valid tokens, in row 2
    ids = np.broadcast_to(np.arange(20) // 5, (3, 20)).copy()
    ok = {**kw, "turn_ids": ids, "mask": np.ones((3, 20), bool)}
    gaescan.turn_gae(**ok, backend=backend)
    bad = ids.copy()
    bad[2, 12] = 0
    with pytest.raises(ValueError, match=r"turn_ids.*non-decreasing.*row 2"):
        gaescan.turn_gae(**{**ok, "turn_ids": bad}, backend=backend)
    # the same id decrease at a masked token is not read
    mask = np.ones((3, 20), bool)
    mask[2, 12] = False
    gaescan.turn_gae(**{**ok, "turn_ids": bad, "mask": mask}, backend=backend)
    # a decrease across a masked span is still one
    bad2 = ids.copy()
    bad2[1, 15:] = 0
    mask = np.ones((3, 20), bool)
    mask[1, 10:15] = False
    with pytest.raises(ValueError, match="row 1"):
        gaescan.turn_gae(**{**ok, "turn_ids": bad2, "mask": mask}, backend=backend)
    # an N-d batch names the batch index
    nd = {k: (x.reshape(3, 1, 20) if isinstance(x, np.ndarray) and x.ndim == 2 else x) for k, x in ok.items()}
    with pytest.raises(ValueError, match=r"row 2 \(batch index \(2, 0\)\)"):
        gaescan.turn_gae(**{**nd, "turn_ids": bad.reshape(3, 1, 20), "last_value": None}, backend=backend)
    with pytest.raises(ValueError, match=r"'values' has shape \(3, 19\).*'rewards' has shape \(3, 20\)"):
        gaescan.turn_gae(**{**kw, "values": kw["values"][:, 1:]}, backend=backend)
    with pytest.raises(ValueError, match=r"'turn_ids' has shape \(3, 21\).*\(3, 20\)"):
        gaescan.turn_gae(**{**kw, "turn_ids": np.zeros((3, 21), np.int32)}, backend=backend)
    with pytest.raises(ValueError, match="'mask' has shape"):
        gaescan.turn_gae(**{**kw, "mask": kw["mask"][:2]}, backend=backend)
    with pytest.raises(ValueError, match="gamma"):
        gaescan.turn_gae(**{**kw, "gamma": 1.5}, backend=backend)
    with pytest.raises(ValueError, match="lam"):
        gaescan.turn_gae(**{**kw, "lam": -0.1}, backend=backend)
    with pytest.raises(ValueError, match="gamma.*varies along the time axis"):
        gaescan.turn_gae(**{**kw, "gamma": np.full((3, 20), 0.9)}, backend=backend)
    with pytest.raises(ValueError, match="last_value"):
        gaescan.turn_gae(**{**kw, "last_value": np.zeros(4)}, backend=backend)
    with pytest.raises(ValueError, match="'turn_ids' must have at least one dimension"):
        gaescan.turn_gae(np.array(1.0), np.array(1.0), np.array(0), gamma=0.9, lam=0.9, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint64_ids_keep_their_order(backend, rng):
    # uint64 ids at and above 2**63 (past int64's range) order as unsigned numbers.
    kw = case(rng, 3, 20)
    small = np.broadcast_to(np.arange(20) // 5, (3, 20)).astype(np.uint64)
    big = small + np.uint64(2**63 - 2)  # ids 2**63 - 2 .. 2**63 + 1
    top = small + np.uint64(2**64 - 4)  # ids up to 2**64 - 1
    want = gaescan.turn_gae(**{**kw, "turn_ids": small}, backend=backend)
    for ids in (big, top):
        got = gaescan.turn_gae(**{**kw, "turn_ids": ids}, backend=backend)
        np.testing.assert_array_equal(got.advantages, want.advantages)
        np.testing.assert_array_equal(got.returns, want.returns)
    bad = big.copy()
    bad[1, 12] = 0
    with pytest.raises(ValueError, match="row 1"):
        gaescan.turn_gae(**{**kw, "turn_ids": bad, "mask": None}, backend=backend)


def test_backend_names(rng):
    kw = case(rng, 2, 10)
    if not _cudasim():  # the simulator runs backend="cuda" on host arrays
        with pytest.raises(TypeError, match=r"backend='cuda' needs GPU arrays.*backend='numba'"):
            gaescan.turn_gae(**kw, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend"):
        gaescan.turn_gae(**kw, backend="jax")


def _cudasim():
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _cupy():
    cp = pytest.importorskip("cupy")
    if not cp.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return cp


@pytest.mark.parametrize("masked", [False, True])
def test_gpu_arrays(rng, masked):
    # CuPy arrays take the "cuda" backend (the default for GPU arrays) and come back as CuPy arrays.
    cp = _cupy()
    kw = case(rng, 5, 300)
    if not masked:
        kw["mask"] = None
        kw["turn_ids"], _ = conversation(rng, 5, 300, spans=0)
    dev = {k: cp.asarray(x) if isinstance(x, np.ndarray) else x for k, x in kw.items()}
    ref = gt.turn_gae(**kw)
    for backend in ("auto", "cuda"):
        res = gaescan.turn_gae(**dev, backend=backend)
        assert isinstance(res.advantages, cp.ndarray) and isinstance(res.returns, cp.ndarray)
        assert_close(cp.asnumpy(res.advantages), ref.advantages, np.float32)
        assert_close(cp.asnumpy(res.returns), ref.returns, np.float32)


def test_gpu_arrays_host_backends_refused(rng):
    cp = _cupy()
    dev = {k: cp.asarray(x) if isinstance(x, np.ndarray) else x for k, x in case(rng, 2, 10).items()}
    with pytest.raises(TypeError, match=r"backend='numpy'.*on the host.*backend='cuda'"):
        gaescan.turn_gae(**dev, backend="numpy")
    with pytest.raises(TypeError, match=r"backend='numba'.*backend='cuda'"):
        gaescan.turn_gae(**dev, backend="numba")


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_sparse_ids_and_lists(backend, rng):
    # Ids need not start at 0 nor be consecutive; the next turn is the next one present.
    kw = case(rng, 3, 45)
    kw["turn_ids"] = (kw["turn_ids"] * 1000 - 50_000).astype(np.int64)
    check(backend, **kw)
    r = [0.0, 1.0, 0.0, 0.0, 2.0]
    v = [0.5, 9.0, 1.0, 9.0, 9.0]
    adv, ret = gaescan.turn_gae(r, v, [-7, -7, 40, 40, 40], gamma=1.0, lam=1.0, backend=backend)
    np.testing.assert_array_equal(adv, [2.5, 2.5, 1.0, 1.0, 1.0])
    assert adv.dtype == gaescan.gae(r, v, gamma=1.0, lam=1.0).advantages.dtype  # lists as gae takes them


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masked", [False, True])
def test_padded_rows(backend, rng, masked):
    # Row views of wider buffers: tokens adjacent, rows not (the kernels' any-stride builds).
    B, T = 4, 129
    kw = case(rng, B, T)
    if not masked:
        kw["mask"] = None
        kw["turn_ids"], _ = conversation(rng, B, T, spans=0)
    wide = {}
    for name in ("rewards", "values", "turn_ids", "mask"):
        x = kw[name]
        if x is None:
            continue
        buf = np.zeros((B, T + 5), dtype=x.dtype)
        buf[:, :T] = x
        wide[name] = buf[:, :T]
    res = check(backend, **{**kw, **wide})
    out = np.zeros((2, B, T + 3), np.float32)
    got = gaescan.turn_gae(**{**kw, **wide}, out=(out[0, :, :T], out[1, :, :T]), backend=backend)
    np.testing.assert_array_equal(got.advantages, res.advantages)
    np.testing.assert_array_equal(out[:, :, T:], 0)
