"""``vtrace`` and ``turn_gae`` on the CUDA backend, run in Numba's CUDA simulator on NumPy arrays.

Run with ``NUMBA_ENABLE_CUDASIM=1`` set before Python starts.  Both functions
compose the CUDA scan and GAE kernels with elementwise array steps; here the
public functions run with ``backend="cuda"`` (the simulator lets it take host
arrays) under tiny tile geometries, so rows of a few dozen steps cross every
thread, tile and look-back boundary of each kernel launch.  The references
are ``gaescan.testing``'s float64 loops.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.cudasim

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
    pytest.skip("set NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in the simulator",
                allow_module_level=True)

pytest.importorskip("numba")

from conftest import (  # noqa: E402
    FLAG_MODES,
    assert_close,
    assert_unchanged,
    assert_zero_where,
    cuda_settings,
    flag_kwargs,
    random_cu_seqlens,
    random_data,
    snapshot,
)

import gaescan  # noqa: E402
import gaescan.testing as gt  # noqa: E402
from gaescan.backends import cuda as cb  # noqa: E402

# Tiny geometries (threads per block, steps per thread, driver), as in test_cuda_sim.py.
ROWS = dict(threads=8, k=2, k_f64=3, k_time_major=2, rows_time_major=4, rows_min_blocks=1)
LOOKBACK = dict(threads=8, k=3, k_f64=2, k_time_major=3, rows_time_major=4, rows_min_blocks=10**9)
LONGWALK = dict(LOOKBACK, k=2, unpublished_tiles=True)
MODES = pytest.mark.parametrize("tun", [ROWS, LOOKBACK, LONGWALK], ids=["rows", "lookback", "longwalk"])


def _dtype(*xs):
    return gt.result_dtype(*xs)


# --------------------------------------------------------------------------- vtrace


def vtrace_cuda(tun, **kw):
    """``gaescan.vtrace`` on the CUDA backend, checked against the reference; the result."""
    snap = snapshot(kw)
    with cuda_settings(tun):
        res = gaescan.vtrace(**kw, backend="cuda")
    ref = gt.vtrace(**kw)
    dtype = _dtype(kw["rewards"], kw["values"], kw["log_rhos"], kw.get("next_values"), kw.get("last_value"),
                   kw.get("last_trace"), kw["gamma"], kw.get("lam", 1.0))
    assert_close(res.vs, ref.vs, dtype)
    assert_close(res.advantages, ref.advantages, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(res.vs, kw["mask"])
        assert_zero_where(res.advantages, kw["mask"])
    return res


def vtrace_case(rng, shape, mode, dtype=np.float32, masked=False):
    v = random_data(rng, shape, dtype)
    kw = dict(rewards=random_data(rng, shape, dtype), values=v,
              log_rhos=(rng.standard_normal(shape) * 0.7).astype(dtype), gamma=0.97, lam=0.9)
    kw.update(flag_kwargs(mode, rng, shape, v))
    if "next_values" not in kw:
        kw["last_value"] = random_data(rng, shape[:-1], dtype)
    if masked:
        kw["mask"] = rng.random(shape) > 0.25
    return kw


@MODES
@pytest.mark.parametrize("mode", FLAG_MODES)
@pytest.mark.parametrize("masked", [False, True], ids=["dense", "masked"])
def test_vtrace_flags_masks(tun, rng, mode, masked):
    vtrace_cuda(tun, **vtrace_case(rng, (3, 29), mode, masked=masked))


@pytest.mark.parametrize("tun", [ROWS, LOOKBACK], ids=["rows", "lookback"])
def test_vtrace_float64_clipping_and_coefficients(tun, rng):
    kw = vtrace_case(rng, (2, 31), "dones", np.float64, masked=True)
    kw.update(gamma=rng.uniform(0.8, 1.0, (2, 1)), lam=rng.uniform(0.5, 1.0, (2, 31)),
              rho_bar=1.5, c_bar=0.8, pg_rho_bar=np.inf)
    vtrace_cuda(tun, **kw)


@pytest.mark.parametrize("masked", [False, True], ids=["dense", "masked"])
def test_vtrace_packed(rng, masked):
    n, S = 47, 5
    cu = random_cu_seqlens(rng, n, S)
    kw = vtrace_case(rng, (n,), "dones", masked=masked)
    kw.update(cu_seqlens=cu, last_value=random_data(rng, (S,)))
    vtrace_cuda(LOOKBACK, **kw)


def test_vtrace_last_trace(rng):
    kw = vtrace_case(rng, (3, 25), "terminated", masked=True)
    vtrace_cuda(LOOKBACK, **kw, last_trace=random_data(rng, (3,)))
    n, S = 40, 4
    kw = vtrace_case(rng, (n,), "dones", masked=True)
    kw.update(cu_seqlens=random_cu_seqlens(rng, n, S), last_value=random_data(rng, (S,)))
    vtrace_cuda(LOOKBACK, **kw, last_trace=random_data(rng, (S,)))


def test_vtrace_time_major_and_out(rng):
    kw = vtrace_case(rng, (27, 3), "term+trunc", masked=True)
    vtrace_cuda(ROWS, **kw, axis=0)
    out = (np.full((27, 3), np.nan, np.float32), np.full((27, 3), np.nan, np.float32))
    with cb.override(**ROWS):
        res = gaescan.vtrace(**kw, axis=0, out=out, backend="cuda")
    assert res.vs is out[0] and res.advantages is out[1]
    ref = gt.vtrace(**kw, axis=0)
    assert_close(out[0], ref.vs, np.float32)
    assert_close(out[1], ref.advantages, np.float32)


@pytest.mark.parametrize("what", ["rewards", "log_rhos", "values"])
def test_vtrace_nan_stays_in_its_episode(rng, what):
    kw = vtrace_case(rng, (2, 30), "none", masked=True)
    d = np.zeros((2, 30), bool)
    d[:, [9, 19]] = True
    kw["dones"] = d
    kw["mask"][:, [9, 12, 19]] = True  # a done at a masked position is not read
    kw[what][:, 12] = np.nan  # inside the episode t = 10 .. 19
    kw["rewards"][:, 25] = np.nan
    kw["mask"][:, 25] = False  # a masked NaN is never read
    res = vtrace_cuda(LOOKBACK, **kw)
    valid = kw["mask"]
    for out in res:
        assert np.all(np.isfinite(out[:, :10])), "a NaN crossed a done into the episode before"
        assert np.all(np.isfinite(out[:, 20:])), "a NaN reached a later episode"
        assert np.isnan(out[:, 12]).all()
        assert np.all(out[~valid] == 0)


def test_vtrace_numpy_backend_unchanged_on_host(rng):
    kw = vtrace_case(rng, (2, 21), "dones", masked=True)
    res = gaescan.vtrace(**kw, backend="numpy")
    ref = gt.vtrace(**kw)
    assert_close(res.vs, ref.vs, np.float32)


# --------------------------------------------------------------------------- turn_gae


def conversation(rng, B, T, p_new=0.2, p_mask=0.25, garbage=True):
    """``(turn_ids, mask)``: increasing ids (with gaps) per row; masked tokens with arbitrary ids."""
    ids = np.cumsum((rng.random((B, T)) < p_new) * rng.integers(1, 4, (B, T)), axis=1) + rng.integers(0, 3, (B, 1))
    mask = rng.random((B, T)) > p_mask
    if garbage:
        ids = np.where(mask, ids, rng.integers(-5, 100, (B, T)))
    return ids.astype(np.int64), mask


def turn_cuda(tun, **kw):
    """``gaescan.turn_gae`` on the CUDA backend, checked against the reference; the result."""
    snap = snapshot(kw)
    with cuda_settings(tun):
        res = gaescan.turn_gae(**kw, backend="cuda")
    ref = gt.turn_gae(**kw)
    dtype = _dtype(kw["rewards"], kw["values"], kw.get("last_value"), kw["gamma"], kw["lam"])
    assert_close(res.advantages, ref.advantages, dtype)
    assert_close(res.returns, ref.returns, dtype)
    assert_unchanged(kw, snap)
    if kw.get("mask") is not None:
        assert_zero_where(res.advantages, kw["mask"])
        assert_zero_where(res.returns, kw["mask"])
    return res


def turn_case(rng, B, T, dtype=np.float32, masked=True, **conv):
    ids, mask = conversation(rng, B, T, garbage=masked, **conv)
    return dict(rewards=random_data(rng, (B, T), dtype), values=random_data(rng, (B, T), dtype),
                turn_ids=ids, mask=mask if masked else None, gamma=0.97, lam=0.9,
                last_value=random_data(rng, (B,), dtype))


@MODES
@pytest.mark.parametrize("masked", [False, True], ids=["dense", "masked"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_turn_gae(tun, rng, masked, dtype):
    turn_cuda(tun, **turn_case(rng, 3, 31, dtype, masked))


@pytest.mark.parametrize("tun", [ROWS, LOOKBACK], ids=["rows", "lookback"])
def test_turn_gae_turn_shapes(tun, rng):
    # One-token turns everywhere, one turn per row, a row without valid tokens, and a row
    # whose only valid tokens sit at its two ends.
    kw = turn_case(rng, 4, 23, p_new=1.0)
    kw["turn_ids"][1] = 7
    kw["mask"][1] = True
    kw["mask"][2] = False
    kw["mask"][3] = False
    kw["mask"][3, [0, 22]] = True
    res = turn_cuda(tun, **kw)
    assert np.all(res.advantages[2] == 0) and np.all(res.returns[2] == 0)


def test_turn_gae_per_row_coefficients_time_major_and_out(rng):
    kw = turn_case(rng, 3, 26)
    kw.update(gamma=rng.uniform(0.5, 1.0, (3, 1)).astype(np.float32),
              lam=rng.uniform(0.0, 1.0, (3, 1)).astype(np.float32))
    turn_cuda(LOOKBACK, **kw)
    tm = {k: (x.T.copy() if isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[1] > 1 else x)
          for k, x in kw.items()}
    tm.update(gamma=kw["gamma"][:, 0], lam=kw["lam"][:, 0])
    turn_cuda(ROWS, **tm, axis=0)
    out = (np.full((3, 26), np.nan, np.float32), np.full((3, 26), np.nan, np.float32))
    with cb.override(**ROWS):
        res = gaescan.turn_gae(**kw, out=out, backend="cuda")
    assert res.advantages is out[0] and res.returns is out[1]
    ref = gt.turn_gae(**kw)
    assert_close(out[0], ref.advantages, np.float32)
    assert_close(out[1], ref.returns, np.float32)


def test_turn_gae_nan_stays_in_its_turn_and_row(rng):
    T = 30
    ids = np.repeat(np.arange(6), 5)[None, :].repeat(2, axis=0)  # turns of 5 tokens
    kw = dict(rewards=random_data(rng, (2, T)), values=random_data(rng, (2, T)), turn_ids=ids,
              mask=np.ones((2, T), bool), gamma=0.9, lam=0.8, last_value=0.5)
    kw["rewards"][0, 17] = np.nan  # turn 3 of row 0
    kw["values"][0, 11] = np.nan  # not a turn's first token: never read
    kw["mask"][1, 4] = False
    kw["rewards"][1, 4] = np.inf  # masked: never read
    res = turn_cuda(LOOKBACK, **kw)
    for out in res:
        assert np.isnan(out[0, :20]).all(), "the NaN turn and the earlier ones are NaN"
        assert np.all(np.isfinite(out[0, 20:])), "a NaN reached a later turn"
        assert np.all(np.isfinite(out[1])), "a NaN reached another row"


def test_turn_gae_unchecked_decreasing_ids(rng):
    # On the device the ids' order is not checked: a turn starts wherever the id changes
    # between valid tokens, which is the reference on ids relabelled run by run.
    kw = turn_case(rng, 2, 24)
    ids = kw["turn_ids"].copy()
    ids[:, 12:] = np.where(kw["mask"][:, 12:], ids[:, 12:] - 1000, ids[:, 12:])
    kw["turn_ids"] = ids
    with cb.override(**LOOKBACK):
        res = gaescan.turn_gae(**kw, backend="cuda")
    runs = np.zeros_like(ids)
    for b in range(2):
        t = np.flatnonzero(kw["mask"][b])
        runs[b, t] = np.cumsum(np.r_[True, ids[b, t][1:] != ids[b, t][:-1]])
    ref = gt.turn_gae(**{**kw, "turn_ids": runs})
    assert_close(res.advantages, ref.advantages, np.float32)
    assert_close(res.returns, ref.returns, np.float32)
    with pytest.raises(ValueError, match="non-decreasing"):
        gaescan.turn_gae(**kw, backend="numpy")
