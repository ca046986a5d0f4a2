"""The carry API: rows split into k time slices, recombined from O(rows) numbers.

Each test simulates k ranks that each hold one contiguous time slice of the
same rows (sequence / context parallelism).  A rank sees only its own slice
and the numbers exchanged between ranks; every exchange is logged, and the
tests check that it is two numbers per row and slice per round.  The
recombined result is compared with the one-shot call and with the float64
oracle (SPEC tolerance).  No Dask needed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_close, flag_kwargs, random_data, random_flags

import gaescan
import gaescan.testing as gt

# ----------------------------------------------------------------- simulation


def random_cuts(rng, T, k):
    """Sorted cut points ``0 = c_0 < ... < c_k = T`` of ``k`` non-empty slices, some of length 1."""
    k = max(1, min(k, T))
    inner = rng.choice(np.arange(1, T), size=k - 1, replace=False) if k > 1 else np.array([], int)
    cuts = np.sort(np.concatenate([[0], inner, [T]])).astype(int)
    return [int(c) for c in cuts]


class Exchange:
    """The numbers that cross between ranks: one ScanSummary per rank and round."""

    def __init__(self):
        self.rounds = []

    def all_gather(self, summaries):
        for s in summaries:
            assert isinstance(s, gaescan.ScanSummary)
        self.rounds.append([(np.asarray(s.decay), np.asarray(s.head)) for s in summaries])
        return summaries

    def numbers(self):
        return sum(d.size + h.size for rnd in self.rounds for d, h in rnd)


def take(x, lo, hi, axis, shape):
    """Rank-local view of an argument: data and per-step coefficients are sliced in time."""
    if x is None or np.ndim(x) == 0:
        return x
    return np.take(np.broadcast_to(x, shape), np.arange(lo, hi), axis=axis)


def sp_gae(rewards, values, *, cuts, axis=-1, last_value=None, last_advantage=None, ex=None, **kw):
    """GAE with rows split at ``cuts`` along ``axis``; the ranks exchange summaries only."""
    ex = ex or Exchange()
    shape = rewards.shape
    k = len(cuts) - 1
    local = [
        {name: take(x, cuts[i], cuts[i + 1], axis, shape) for name, x in
         dict(rewards=rewards, values=values, **kw).items()}
        for i in range(k)
    ]
    if kw.get("next_values") is None:
        # Round 1: the V' bootstrap of every slice (V at the first valid step after it).
        bs = ex.all_gather([gaescan.bootstrap_summary(d["values"], mask=d.get("mask"), axis=axis)
                            for d in local])
        boot = gaescan.carry_in(bs, last_value)
        lvs = [boot[i] for i in range(k)]
    else:
        lvs = [None] * k
    # Round 2: the advantage carry.
    ss = ex.all_gather([gaescan.gae_summary(**d, last_value=lvs[i], axis=axis) for i, d in enumerate(local)])
    adv_in = gaescan.carry_in(ss, last_advantage)
    parts = [gaescan.gae(**d, last_value=lvs[i], last_advantage=adv_in[i], axis=axis)
             for i, d in enumerate(local)]
    adv = np.concatenate([p.advantages for p in parts], axis=axis)
    ret = np.concatenate([p.returns for p in parts], axis=axis)
    return adv, ret, ex


def sp_returns(rewards, *, cuts, axis=-1, last_value=None, ex=None, **kw):
    ex = ex or Exchange()
    shape = rewards.shape
    local = [{name: take(x, cuts[i], cuts[i + 1], axis, shape) for name, x in dict(rewards=rewards, **kw).items()}
             for i in range(len(cuts) - 1)]
    ss = ex.all_gather([gaescan.returns_summary(**d, axis=axis) for d in local])
    c = gaescan.carry_in(ss, last_value)
    parts = [gaescan.discounted_returns(**d, last_value=c[i], axis=axis) for i, d in enumerate(local)]
    return np.concatenate(parts, axis=axis), ex


def sp_scan(a, b, *, cuts, reverse, axis=-1, initial=None, ex=None):
    ex = ex or Exchange()
    shape = b.shape
    local = [(take(a, cuts[i], cuts[i + 1], axis, shape), take(b, cuts[i], cuts[i + 1], axis, shape))
             for i in range(len(cuts) - 1)]
    ss = ex.all_gather([gaescan.scan_summary(ai, bi, reverse=reverse, axis=axis) for ai, bi in local])
    c = gaescan.carry_in(ss, initial, reverse=reverse)
    parts = [gaescan.linear_scan(ai, bi, reverse=reverse, initial=c[i], axis=axis)
             for i, (ai, bi) in enumerate(local)]
    return np.concatenate(parts, axis=axis), ex


def rows_of(shape, axis):
    return math.prod(n for i, n in enumerate(shape) if i != axis % len(shape))


def assert_o_rows(ex, shape, axis, k):
    """Each round: every one of the k ranks publishes exactly two numbers per row."""
    rows = rows_of(shape, axis)
    for rnd in ex.rounds:
        assert len(rnd) == k
        for d, h in rnd:
            assert d.size == rows and h.size == rows
    assert ex.numbers() == 2 * rows * k * len(ex.rounds)


# ----------------------------------------------------------------------- GAE

MASKS = ["none", "random", "slice-masked"]


def make_mask(mode, rng, shape, axis, cuts):
    if mode == "none":
        return None
    m = rng.random(shape) < 0.6
    if mode == "slice-masked" and len(cuts) > 2:
        # Mask one whole interior slice (and a few whole rows of another).
        i = int(rng.integers(0, len(cuts) - 1))
        idx = [slice(None)] * len(shape)
        idx[axis] = slice(cuts[i], cuts[i + 1])
        m[tuple(idx)] = False
    return m


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_mode", MASKS)
@pytest.mark.parametrize("flags", ["none", "dones", "terminated", "term+trunc", "trunc-only"])
@pytest.mark.parametrize("layout", ["BT", "TB", "3d"])
def test_gae_slices(rng, dtype, mask_mode, flags, layout):
    T = int(rng.integers(2, 90))
    shape, axis = {"BT": ((5, T), -1), "TB": ((T, 4), 0), "3d": ((2, T, 3), 1)}[layout]
    r = random_data(rng, shape, dtype)
    v = random_data(rng, shape, dtype)
    kw = flag_kwargs(flags, rng, shape, v, p=0.15)
    k = int(rng.integers(1, min(T, 9) + 1))
    cuts = random_cuts(rng, T, k)
    kw["mask"] = make_mask(mask_mode, rng, shape, axis, cuts)
    batch = tuple(n for i, n in enumerate(shape) if i != axis % len(shape))
    if "next_values" not in kw:
        kw["last_value"] = random_data(rng, batch, dtype) if rng.random() < 0.5 else 0.7
    last_adv = random_data(rng, batch, dtype) if rng.random() < 0.5 else -0.25
    gamma, lam = 0.97, 0.9
    adv, ret, ex = sp_gae(r, v, cuts=cuts, axis=axis, gamma=gamma, lam=lam, last_advantage=last_adv, **kw)
    one = gaescan.gae(r, v, gamma=gamma, lam=lam, axis=axis, last_advantage=last_adv, **kw)
    ref = gt.gae(r, v, gamma=gamma, lam=lam, axis=axis, last_advantage=last_adv, **kw)
    assert_close(adv, ref[0], dtype)
    assert_close(ret, ref[1], dtype)
    gt.assert_close(adv, one.advantages, dtype=dtype)
    if kw["mask"] is not None:
        assert np.all(adv[~kw["mask"]] == 0)
    assert_o_rows(ex, shape, axis, len(cuts) - 1)
    assert len(ex.rounds) == (1 if "next_values" in kw else 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gae_per_step_coefficients(rng, dtype):
    B, T = 4, 120
    r, v = random_data(rng, (B, T), dtype), random_data(rng, (B, T), dtype)
    gamma = rng.uniform(0.8, 1.0, (B, T)).astype(dtype)
    lam = rng.uniform(0.5, 1.0, (B, 1)).astype(dtype)
    d = random_flags(rng, (B, T), 0.05)
    cuts = random_cuts(rng, T, 6)
    adv, ret, ex = sp_gae(r, v, cuts=cuts, gamma=gamma, lam=lam, dones=d, last_value=0.3)
    ref = gt.gae(r, v, gamma=gamma, lam=lam, dones=d, last_value=0.3)
    assert_close(adv, ref[0], dtype)
    assert_close(ret, ref[1], dtype)
    assert_o_rows(ex, (B, T), -1, len(cuts) - 1)


def test_gae_one_slice_is_bit_identical(rng):
    B, T = 3, 50
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d, m = random_flags(rng, (B, T), 0.1), random_flags(rng, (B, T), 0.7)
    adv, ret, _ = sp_gae(r, v, cuts=[0, T], gamma=0.99, lam=0.95, dones=d, mask=m, last_value=0.5)
    one = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, mask=m, last_value=0.5)
    np.testing.assert_array_equal(adv, one.advantages, strict=True)
    np.testing.assert_array_equal(ret, one.returns, strict=True)


def test_gae_dones_at_slice_boundaries(rng):
    B, T = 4, 64
    cuts = [0, 1, 16, 17, 40, 63, 64]
    r, v = random_data(rng, (B, T), np.float64), random_data(rng, (B, T), np.float64)
    d = np.zeros((B, T), bool)
    for c in cuts[1:-1]:
        d[0, c - 1] = True   # done at the last step of a slice
        d[1, c] = True       # done at the first step of the next one
    d[2, :] = True           # every step is done
    adv, ret, _ = sp_gae(r, v, cuts=cuts, gamma=0.99, lam=0.95, dones=d, last_value=np.ones(B),
                         last_advantage=2.0)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=np.ones(B), last_advantage=2.0)
    assert_close(adv, ref[0], np.float64)
    assert_close(ret, ref[1], np.float64)


@pytest.mark.parametrize("flag", ["dones", "terminated"])
def test_gae_nan_beyond_a_done_does_not_leak(rng, flag):
    B, T = 3, 80
    r, v = random_data(rng, (B, T), np.float64), random_data(rng, (B, T), np.float64)
    d = np.zeros((B, T), bool)
    d[:, 30] = True
    r[:, 31:] = np.nan  # a later episode full of NaN, in other slices
    v[:, 31:] = np.nan
    cuts = [0, 10, 31, 32, 60, T]
    adv, ret, _ = sp_gae(r, v, cuts=cuts, gamma=0.99, lam=0.95, last_value=np.nan, last_advantage=np.nan,
                         **{flag: d})
    assert np.all(np.isfinite(adv[:, :31])) and np.all(np.isnan(adv[:, 31:]))
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, last_value=np.nan, last_advantage=np.nan, **{flag: d})
    assert_close(adv, ref[0], np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_nonfinite_through_slices_whose_decay_underflows(dtype, poison):
    """A slice's decay product that underflows is no cut: a NaN or an infinity in a
    later slice reaches the whole row, as in the one-process scan.  0.25^600 is 0
    in float64, 0.5^200 in float32; every step's decay is nonzero."""
    T = 1400
    cuts = [0, 100, 700, 1300, T]
    r = np.ones((2, T), dtype)
    v = np.zeros((2, T), dtype)
    r[:, 1350] = poison
    lam = np.array([[0.25], [0.5]], dtype)  # per-row λ: the array path, and a scalar γ below
    for got, want in (
        (sp_gae(r, v, cuts=cuts, gamma=1.0, lam=lam)[0], gt.gae(r, v, gamma=1.0, lam=lam)[0]),
        (sp_gae(r, v, cuts=cuts, gamma=0.25, lam=1.0)[0], gt.gae(r, v, gamma=0.25, lam=1.0)[0]),
        (sp_returns(r, cuts=cuts, gamma=0.25)[0], gt.discounted_returns(r, gamma=0.25)),
        (sp_scan(np.broadcast_to(lam, (2, T)), r, cuts=cuts, reverse=True)[0],
         gt.linear_scan(np.broadcast_to(lam, (2, T)), r, reverse=True)),
        (sp_scan(np.broadcast_to(lam, (2, T)), r[:, ::-1], cuts=cuts, reverse=False)[0][:, ::-1],
         gt.linear_scan(np.broadcast_to(lam, (2, T)), r[:, ::-1], reverse=False)[:, ::-1]),
    ):
        assert not np.isfinite(want[:, :1351]).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        assert_close(got[fin], want[fin], dtype)


def test_nan_before_a_zero_decay_across_slices():
    # A slice whose decay product is zero passes no carry on, as the zero decay
    # passes none step by step: the NaN at step 6 reaches no earlier slice.
    r = np.ones((1, 9))
    r[0, 6] = np.nan
    v = np.zeros((1, 9))
    got = sp_gae(r, v, cuts=[0, 3, 6, 9], gamma=0.9, lam=0.0)[0]
    want = gt.gae(r, v, gamma=0.9, lam=0.0)[0]
    assert np.isnan(want[0, 6]) and np.isfinite(want[0, :6]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_gae_fully_masked_rows_and_slices(rng):
    B, T = 4, 40
    cuts = [0, 5, 6, 20, 39, 40]
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    m = random_flags(rng, (B, T), 0.5)
    m[0] = False              # a whole row masked
    m[1, 5:39] = False        # three slices masked in one row: the bootstrap skips them
    m[2, 39] = False          # the last step masked: last_value reaches an earlier slice
    r[~m] = np.nan            # masked positions are never read
    v[~m] = np.nan
    lv = random_data(rng, (B,))
    adv, ret, _ = sp_gae(r, v, cuts=cuts, gamma=0.9, lam=0.8, mask=m, last_value=lv, last_advantage=0.5)
    ref = gt.gae(r, v, gamma=0.9, lam=0.8, mask=m, last_value=lv, last_advantage=0.5)
    assert_close(adv, ref[0], np.float32)
    assert np.all(adv[~m] == 0) and np.all(ret[~m] == 0)


def test_one_dimensional_rows(rng):
    T = 50
    r, v = random_data(rng, (T,), np.float64), random_data(rng, (T,), np.float64)
    d = random_flags(rng, (T,), 0.1)
    cuts = random_cuts(rng, T, 5)
    adv, ret, ex = sp_gae(r, v, cuts=cuts, gamma=0.99, lam=0.95, dones=d, last_value=1.5)
    ref = gt.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=1.5)
    assert_close(adv, ref[0], np.float64)
    assert ex.numbers() == 2 * 2 * (len(cuts) - 1)


# ------------------------------------------------------------ returns, scans


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_mode", MASKS)
@pytest.mark.parametrize("axis", [-1, 0])
def test_returns_slices(rng, dtype, mask_mode, axis):
    T = int(rng.integers(2, 100))
    shape = (4, T) if axis == -1 else (T, 4)
    r = random_data(rng, shape, dtype)
    d = random_flags(rng, shape, 0.1)
    cuts = random_cuts(rng, T, int(rng.integers(1, 8)))
    m = make_mask(mask_mode, rng, shape, axis, cuts)
    gamma = rng.uniform(0.9, 1.0, shape).astype(dtype) if rng.random() < 0.5 else 0.95
    lv = random_data(rng, (4,), dtype)
    got, ex = sp_returns(r, cuts=cuts, axis=axis, gamma=gamma, dones=d, mask=m, last_value=lv)
    ref = gt.discounted_returns(r, gamma=gamma, dones=d, mask=m, last_value=lv, axis=axis)
    assert_close(got, ref, dtype)
    one = gaescan.discounted_returns(r, gamma=gamma, dones=d, mask=m, last_value=lv, axis=axis)
    gt.assert_close(got, one, dtype=dtype)
    assert_o_rows(ex, shape, axis, len(cuts) - 1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("a_kind", ["scalar", "array", "zeros", "per-row"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scan_slices(rng, reverse, a_kind, dtype):
    B, T = 3, int(rng.integers(2, 120))
    b = random_data(rng, (B, T), dtype)
    a = {
        "scalar": 0.97,
        "array": rng.uniform(-1.02, 1.02, (B, T)).astype(dtype),
        "zeros": np.where(rng.random((B, T)) < 0.1, 0.0, rng.uniform(0.5, 1.0, (B, T))).astype(dtype),
        "per-row": rng.uniform(0.9, 1.0, (B, 1)).astype(dtype),
    }[a_kind]
    cuts = random_cuts(rng, T, int(rng.integers(1, 9)))
    init = random_data(rng, (B,), dtype)
    got, ex = sp_scan(a, b, cuts=cuts, reverse=reverse, initial=init)
    assert_close(got, gt.linear_scan(a, b, reverse=reverse, initial=init), dtype)
    assert_o_rows(ex, (B, T), -1, len(cuts) - 1)


def test_scan_zero_decay_is_a_select(rng):
    """An inf carry does not cross a zero decay (the kernels select, so must the carry pass)."""
    b = np.ones((1, 10))
    a = np.full((1, 10), 0.5)
    a[0, 3] = 0.0
    got, _ = sp_scan(a, b, cuts=[0, 3, 4, 10], reverse=False, initial=np.inf)
    assert np.all(np.isinf(got[0, :3])) and np.all(np.isfinite(got[0, 3:]))
    got, _ = sp_scan(a, b, cuts=[0, 3, 4, 10], reverse=True, initial=np.inf)
    assert np.all(np.isfinite(got[0, :4])) and np.all(np.isinf(got[0, 4:]))


# ------------------------------------------------------------ the summaries


def test_gae_summary_is_decay_product_and_zero_carry_head(rng):
    B, T = 6, 30
    r, v = random_data(rng, (B, T), np.float64), random_data(rng, (B, T), np.float64)
    d, m = random_flags(rng, (B, T), 0.05), random_flags(rng, (B, T), 0.7)
    m[0] = False
    gamma = rng.uniform(0.9, 1.0, (B, T))
    s = gaescan.gae_summary(r, v, gamma=gamma, lam=0.9, dones=d, mask=m, last_value=0.4)
    adv0, _ = gt.gae(r, v, gamma=gamma, lam=0.9, dones=d, mask=m, last_value=0.4)
    for i in range(B):
        valid = np.flatnonzero(m[i])
        want_head = adv0[i, valid[0]] if valid.size else 0.0
        want_decay = 1.0
        for t in valid:
            want_decay *= 0.0 if d[i, t] else gamma[i, t] * 0.9
        assert s.head[i] == pytest.approx(want_head, rel=1e-12, abs=1e-12)
        assert s.decay[i] == pytest.approx(want_decay, rel=1e-12, abs=1e-300)
    assert s.decay.shape == s.head.shape == (B,)


def test_bootstrap_summary(rng):
    v = random_data(rng, (3, 8))
    m = np.ones((3, 8), bool)
    m[1, :5] = False
    m[2] = False
    s = gaescan.bootstrap_summary(v, mask=m)
    np.testing.assert_array_equal(s.head, [v[0, 0], v[1, 5], 0.0])
    np.testing.assert_array_equal(s.decay, [0.0, 0.0, 1.0])
    s = gaescan.bootstrap_summary(v.T, axis=0)
    np.testing.assert_array_equal(s.head, v[:, 0])


def test_empty_slice_summary():
    s = gaescan.returns_summary(np.zeros((3, 0), np.float32), gamma=0.9)
    np.testing.assert_array_equal(s.decay, np.ones(3, np.float32))
    np.testing.assert_array_equal(s.head, np.zeros(3, np.float32))


def test_carry_in_stacked_and_sequence_agree(rng):
    ss = [gaescan.ScanSummary(rng.random(4), rng.standard_normal(4)) for _ in range(5)]
    stacked = gaescan.ScanSummary(np.stack([s.decay for s in ss]), np.stack([s.head for s in ss]))
    for rev in (True, False):
        a = gaescan.carry_in(ss, 1.5, reverse=rev)
        b = gaescan.carry_in(stacked, 1.5, reverse=rev)
        np.testing.assert_array_equal(a, b)
        assert a.shape == (5, 4)
    c = gaescan.carry_in(ss, 1.5)
    np.testing.assert_array_equal(c[-1], np.full(4, 1.5))
    np.testing.assert_allclose(c[-2], ss[-1].head + ss[-1].decay * 1.5)


def test_carry_in_errors():
    s = gaescan.ScanSummary(np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        gaescan.carry_in([s, s], boundary=np.zeros(4))
    with pytest.raises(ValueError, match="match"):
        gaescan.carry_in(gaescan.ScanSummary(np.ones((2, 3)), np.ones((2, 4))))
    with pytest.raises(TypeError, match="summaries"):
        gaescan.carry_in("nope")
    with pytest.raises(TypeError, match="summaries"):
        gaescan.carry_in([])
    with pytest.raises(TypeError, match="reverse"):
        gaescan.carry_in([s], reverse="yes")
    with pytest.raises(TypeError):
        gaescan.carry_in([s], boundary="x")
    with pytest.raises(TypeError, match="real numbers"):
        gaescan.carry_in(gaescan.ScanSummary(np.array([["a"]]), np.array([["b"]])))


def test_summary_validation_errors(rng):
    r = random_data(rng, (2, 5))
    with pytest.raises(ValueError, match="shape"):
        gaescan.gae_summary(r, r[:, :4], gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        gaescan.returns_summary(r, gamma=1.5)
    with pytest.raises(TypeError, match="reverse"):
        gaescan.scan_summary(0.5, r, reverse=1)
    with pytest.raises(ValueError, match="shape"):
        gaescan.bootstrap_summary(r, mask=np.ones((2, 4), bool))
    with pytest.raises(TypeError, match="array"):
        gaescan.bootstrap_summary(1.0)


def test_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    B, T = 3, 40
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d = random_flags(rng, (B, T), 0.1)
    cuts = [0, 7, 8, 40]
    spans = list(zip(cuts[:-1], cuts[1:], strict=True))
    tr, tv, td = (torch.from_numpy(x) for x in (r, v, d))
    boot = gaescan.carry_in([gaescan.bootstrap_summary(tv[:, a:b]) for a, b in spans], 0.0)
    assert isinstance(boot, torch.Tensor)
    ss = [gaescan.gae_summary(tr[:, a:b], tv[:, a:b], gamma=0.99, lam=0.95, dones=td[:, a:b], last_value=boot[i])
          for i, (a, b) in enumerate(spans)]
    assert isinstance(ss[0].decay, torch.Tensor)
    c = gaescan.carry_in(ss)
    parts = [gaescan.gae(tr[:, a:b], tv[:, a:b], gamma=0.99, lam=0.95, dones=td[:, a:b], last_value=boot[i],
                         last_advantage=c[i]).advantages for i, (a, b) in enumerate(spans)]
    adv = torch.cat(parts, dim=1).numpy()
    assert_close(adv, gt.gae(r, v, gamma=0.99, lam=0.95, dones=d)[0], np.float32)


@pytest.mark.slow
def test_long_rows_float32_within_spec_tolerance(rng):
    """2^17-step rows, γλ = 1 (no decay to hide errors), 16 slices: float32 carries stay within SPEC."""
    B, T = 2, 1 << 17
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d = random_flags(rng, (B, T), 1e-4)
    cuts = random_cuts(rng, T, 16)
    adv, ret, _ = sp_gae(r, v, cuts=cuts, gamma=1.0, lam=1.0, dones=d, last_value=0.5)
    ref = gt.gae(r, v, gamma=1.0, lam=1.0, dones=d, last_value=0.5)
    assert_close(adv, ref[0], np.float32)
    assert_close(ret, ref[1], np.float32)


@pytest.mark.parametrize("T", [1, 5, 1024, 1025, 5000, 70001])
def test_after_last_cut_matches_a_loop(T):
    """The step after each row's last cut, searched in growing trailing windows."""
    from gaescan._carry import _after_last_cut

    rng = np.random.default_rng(T)
    cut = rng.random((7, T)) < 3.0 / T
    cut[0] = False  # no cut: 0
    cut[1, :] = False
    cut[1, 0] = True  # only the first step
    cut[2, -1] = True  # the last step: T
    if T > 3000:
        cut[3] = False
        cut[3, 10] = True  # far from the end: several window growths
    want = [max((t + 1 for t in range(T) if cut[i, t]), default=0) for i in range(cut.shape[0])]
    np.testing.assert_array_equal(_after_last_cut(np, cut), want)
