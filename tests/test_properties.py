"""Hypothesis property tests: random shapes, flags, masks, packings and
coefficients against the oracle, plus NaN isolation between episodes and
masked positions.

Array contents come from a NumPy generator seeded by a drawn integer (fast);
everything structural (shapes, which flags, which layout) is drawn directly so
that Hypothesis shrinks it.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FLAG_MODES, assert_close, assert_unchanged, flag_kwargs, random_data, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gaescan.testing as gt

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    # The same examples on every run and machine: a CI run is reproducible, and
    # no local example database changes what it checks.
    derandomize=True,
    database=None,
)

seeds = st.integers(0, 2**32 - 1)


def _coef(form, g, shape, axis, lo):
    if form == "scalar":
        return float(g.uniform(lo, 1.0)) if g.random() < 0.8 else 1.0
    if form == "per-row":
        s = list(shape)
        s[axis] = 1
        return g.uniform(lo, 1.0, s).astype(np.float32)
    # per-step, with exact ones mixed in (γλ reaching 1)
    return np.where(g.random(shape) < 0.3, 1.0, g.uniform(lo, 1.0, shape)).astype(np.float32)


@st.composite
def gae_problems(draw, small=False):
    seed = draw(seeds)
    g = np.random.default_rng(seed)
    ndim = draw(st.integers(1, 3))
    max_t = 40 if small else 90
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = [draw(st.integers(0, 4)) for _ in range(ndim - 1)]
    shape.insert(axis % ndim, draw(st.integers(0, max_t)))
    shape = tuple(shape)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    r = random_data(g, shape, dtype)
    v = random_data(g, shape, draw(st.sampled_from([np.float32, np.float16, dtype])))
    mode = draw(st.sampled_from(FLAG_MODES))
    flag_dtype = draw(st.sampled_from([bool, np.int8, np.float32]))
    kw = dict(rewards=r, values=v, axis=axis)
    kw.update(
        flag_kwargs(mode, g, shape, v, p=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])), dtype=flag_dtype)
    )
    if draw(st.booleans()):
        kw["mask"] = g.random(shape) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    kw["gamma"] = _coef(draw(st.sampled_from(["scalar", "per-row", "per-step"])), g, shape, axis, 0.8)
    kw["lam"] = _coef(draw(st.sampled_from(["scalar", "per-row", "per-step"])), g, shape, axis, 0.5)
    if "next_values" not in kw and draw(st.booleans()):
        batch = tuple(s for i, s in enumerate(shape) if i != axis % ndim)
        kw["last_value"] = random_data(g, batch, dtype) if draw(st.booleans()) else float(g.standard_normal())
    if draw(st.booleans()):  # a non-contiguous view of the same numbers
        kw["rewards"] = np.asfortranarray(r)
        kw["values"] = np.repeat(v, 2, axis=0)[::2] if ndim > 1 and shape[0] else v
    return kw


def _check_gae(backend, kw):
    snap = snapshot(kw)
    res = backend.gae(**kw)
    ref_adv, ref_ret = gt.gae(**kw)
    dtype = gt.result_dtype(
        kw["rewards"], kw["values"], kw.get("next_values"), kw.get("last_value"), kw["gamma"], kw["lam"]
    )
    assert_close(res.advantages, ref_adv, dtype)
    assert_close(res.returns, ref_ret, dtype)
    if "mask" in kw:
        keep = kw["mask"]
        assert np.all(res.advantages[~keep] == 0) and np.all(res.returns[~keep] == 0)
    assert_unchanged(kw, snap)


@SETTINGS
@given(data=st.data())
def test_gae_random_problems(backend, data):
    _check_gae(backend, data.draw(gae_problems(small=backend.small)))


@st.composite
def packed_problems(draw):
    seed = draw(seeds)
    g = np.random.default_rng(seed)
    lengths = draw(st.lists(st.integers(0, 20), min_size=1, max_size=10))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(draw(st.sampled_from([np.int32, np.int64])))
    n = int(cu[-1])
    r, v = random_data(g, (n,)), random_data(g, (n,))
    kw = dict(rewards=r, values=v, cu_seqlens=cu, gamma=0.97, lam=0.9)
    mode = draw(st.sampled_from(FLAG_MODES))
    kw.update(flag_kwargs(mode, g, (n,), v, p=0.15))
    if draw(st.booleans()):
        kw["mask"] = g.random(n) < 0.7
    if draw(st.booleans()):
        kw["gamma"] = g.uniform(0.8, 1.0, n).astype(np.float32)
    if "next_values" not in kw and draw(st.booleans()):
        kw["last_value"] = random_data(g, (len(lengths),))
    return kw


@SETTINGS
@given(data=st.data())
def test_gae_random_packing(backend, data):
    kw = data.draw(packed_problems())
    _check_gae(backend, kw)
    # equivalent to running each segment on its own
    res = backend.gae(**kw)
    cu = kw["cu_seqlens"]
    for s in range(len(cu) - 1):
        sl = slice(int(cu[s]), int(cu[s + 1]))
        one = {
            k: (x[sl] if isinstance(x, np.ndarray) and x.shape == kw["rewards"].shape else x)
            for k, x in kw.items()
            if k != "cu_seqlens"
        }
        if isinstance(kw.get("last_value"), np.ndarray):
            one["last_value"] = kw["last_value"][s]
        alone = backend.gae(**one)
        np.testing.assert_allclose(res.advantages[sl], alone.advantages, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    seed=seeds,
    T=st.integers(0, 80),
    B=st.integers(0, 3),
    p=st.sampled_from([0.0, 0.1, 0.5]),
    masked=st.booleans(),
    gamma_form=st.sampled_from(["scalar", "per-row", "per-step"]),
    lv=st.booleans(),
    axis0=st.booleans(),
)
def test_returns_random(backend, seed, T, B, p, masked, gamma_form, lv, axis0):
    g = np.random.default_rng(seed)
    shape, axis = ((T, B), 0) if axis0 else ((B, T), -1)
    kw = dict(rewards=random_data(g, shape), axis=axis, gamma=_coef(gamma_form, g, shape, axis, 0.8))
    if p:
        kw["dones"] = g.random(shape) < p
    if masked:
        kw["mask"] = g.random(shape) < 0.7
    if lv:
        kw["last_value"] = random_data(g, (B,))
    snap = snapshot(kw)
    out = backend.returns(**kw)
    assert_close(
        out, gt.discounted_returns(**kw), gt.result_dtype(kw["rewards"], kw["gamma"], kw.get("last_value"))
    )
    assert_unchanged(kw, snap)


@SETTINGS
@given(
    seed=seeds,
    T=st.integers(0, 80),
    B=st.integers(0, 3),
    reverse=st.booleans(),
    a_form=st.sampled_from(["scalar", "per-row", "per-step", "per-time"]),
    init=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_scan_random(backend, seed, T, B, reverse, a_form, init, dtype):
    g = np.random.default_rng(seed)
    b = random_data(g, (B, T), dtype)
    a = {
        "scalar": float(g.uniform(-1.0, 1.0)),
        "per-row": g.uniform(-1.0, 1.0, (B, 1)).astype(dtype),
        "per-step": g.uniform(-1.05, 1.05, (B, T)).astype(dtype),
        "per-time": g.uniform(0.0, 1.0, (T,)).astype(dtype),
    }[a_form]
    kw = dict(a=a, b=b, reverse=reverse)
    if init:
        kw["initial"] = random_data(g, (B,), dtype)
    y = backend.scan(**kw)
    assert_close(y, gt.linear_scan(**kw), np.dtype(dtype))


# ------------------------------------------------------------------ NaN isolation


def _episodes(g, T, n_ends):
    """Indices of episode ends (steps after which an episode stops) in a row of T."""
    return np.sort(g.choice(np.arange(T - 1), size=min(n_ends, T - 1), replace=False))


POISON = [np.nan, np.inf, -np.inf]


@SETTINGS
@given(
    seed=seeds,
    T=st.integers(4, 60),
    how=st.sampled_from(["dones", "terminated", "truncated", "mixed"]),
    where=st.sampled_from(["rewards", "values", "next_values"]),
    poison=st.sampled_from(POISON),
    masked=st.booleans(),
)
def test_nan_stays_in_its_episode(backend, seed, T, how, where, poison, masked):
    g = np.random.default_rng(seed)
    B = 3
    r, v, nv = (random_data(g, (B, T)) for _ in range(3))
    ends = np.zeros((B, T), bool)
    for b in range(B):
        ends[b, _episodes(g, T, 2)] = True
    kw = dict(rewards=r, values=v, gamma=0.99, lam=0.95)
    if how == "dones":
        kw["dones"] = ends
    elif how == "terminated":
        kw.update(terminated=ends, next_values=nv)
    elif how == "truncated":
        kw.update(truncated=ends, next_values=nv)
    else:
        split = g.random((B, T)) < 0.5
        kw.update(terminated=ends & split, truncated=ends & ~split, next_values=nv)
    if where == "next_values" and "next_values" not in kw:
        where = "values"
    if masked:
        kw["mask"] = g.random((B, T)) < 0.8
        ends &= kw["mask"]  # a flag at a masked position is not read: no episode end there
    # episode id of every step: a new episode starts after each end
    episode = np.concatenate([np.zeros((B, 1), int), np.cumsum(ends, axis=1)[:, :-1]], axis=1)
    b0, t0 = int(g.integers(B)), int(g.integers(T))
    poisoned = {k: (x.copy() if k == where else x) for k, x in kw.items()}
    poisoned[where][b0, t0] = poison
    clean = backend.gae(**kw)
    dirty = backend.gae(**poisoned)
    other = np.ones((B, T), bool)
    other[b0] = episode[b0] != episode[b0, t0]
    # values at the first step of an episode are read as V' by the previous
    # episode only when it was not cut by a done -- never, here.
    for got, want in zip(dirty, clean, strict=True):
        np.testing.assert_array_equal(got[other], want[other])


@SETTINGS
@given(
    seed=seeds,
    T=st.integers(1, 60),
    poison=st.sampled_from(POISON + [1e30]),
    flags=st.sampled_from(["dones", "term+trunc"]),
)
def test_masked_positions_are_never_read(backend, seed, T, poison, flags):
    g = np.random.default_rng(seed)
    B = 3
    r, v, nv = (random_data(g, (B, T)) for _ in range(3))
    m = g.random((B, T)) < 0.6
    kw = dict(rewards=r, values=v, gamma=g.uniform(0.5, 1.0, (B, T)).astype(np.float32), lam=0.9, mask=m)
    if flags == "dones":
        kw["dones"] = g.random((B, T)) < 0.2
    else:
        kw.update(terminated=g.random((B, T)) < 0.1, truncated=g.random((B, T)) < 0.1, next_values=nv)
    clean = backend.gae(**kw)
    dirty_kw = {k: (x.copy() if isinstance(x, np.ndarray) else x) for k, x in kw.items()}
    for name in ("rewards", "values", "next_values"):
        if name in dirty_kw:
            dirty_kw[name][~m] = poison
    for name in ("dones", "terminated", "truncated"):
        if name in dirty_kw:
            dirty_kw[name][~m] = g.random(int((~m).sum())) < 0.5  # flags there are not read either
    dirty_kw["gamma"][~m] = g.uniform(0.0, 1.0, int((~m).sum()))
    snap = snapshot(dirty_kw)
    dirty = backend.gae(**dirty_kw)
    assert_unchanged(dirty_kw, snap)  # NaN/inf inputs and flags are left as they were
    for got, want in zip(dirty, clean, strict=True):
        np.testing.assert_array_equal(got, want)
        assert np.all(got[~m] == 0)


@SETTINGS
@given(seed=seeds, T=st.integers(2, 60), poison=st.sampled_from(POISON))
def test_returns_nan_stays_in_its_episode(backend, seed, T, poison):
    g = np.random.default_rng(seed)
    B = 2
    r = random_data(g, (B, T))
    d = np.zeros((B, T), bool)
    for b in range(B):
        d[b, _episodes(g, T, 2)] = True
    m = g.random((B, T)) < 0.8
    d &= m  # a done at a masked position is not read
    clean = backend.returns(r, gamma=0.99, dones=d, mask=m)
    b0, t0 = int(g.integers(B)), int(g.integers(T))
    rp = r.copy()
    rp[b0, t0] = poison
    dirty = backend.returns(rp, gamma=0.99, dones=d, mask=m)
    episode = np.concatenate([np.zeros((B, 1), int), np.cumsum(d, axis=1)[:, :-1]], axis=1)
    other = np.ones((B, T), bool)
    other[b0] = (episode[b0] != episode[b0, t0]) | (~m[b0, t0])
    np.testing.assert_array_equal(dirty[other], clean[other])


@pytest.mark.parametrize("poison", POISON, ids=str)
def test_nan_next_values_at_terminated_steps_unused(backend, rng, poison):
    """V' at a terminated step is not read (a select, not a multiply by 0)."""
    B, T = 3, 50
    r, v, nv = (random_data(rng, (B, T)) for _ in range(3))
    term = rng.random((B, T)) < 0.2
    clean = backend.gae(r, v, gamma=0.99, lam=0.95, terminated=term, next_values=nv)
    nvp = nv.copy()
    nvp[term] = poison
    dirty = backend.gae(r, v, gamma=0.99, lam=0.95, terminated=term, next_values=nvp)
    np.testing.assert_array_equal(dirty.advantages, clean.advantages)
    np.testing.assert_array_equal(dirty.returns, clean.returns)


@pytest.mark.parametrize("poison", POISON, ids=str)
def test_nan_last_value_unused_after_done(backend, rng, poison):
    B, T = 3, 20
    r, v = random_data(rng, (B, T)), random_data(rng, (B, T))
    d = rng.random((B, T)) < 0.1
    d[:, -1] = True
    lv = np.full(B, poison, np.float32)
    a = backend.gae(r, v, gamma=0.99, lam=0.95, dones=d, last_value=lv)
    b = backend.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    np.testing.assert_array_equal(a.advantages, b.advantages)


@pytest.mark.xfail(strict=True, reason=(
    "float32 returns R = A + V cancel when |R| is far smaller than |V|: A's float32 rounding "
    "(relative 6e-8 of |V|) is then a large fraction of R; the SPEC's relative-L2 bound on "
    "returns cannot hold pointwise there (raised in the issue note)"))
def test_returns_that_cancel_against_values(backend):
    r = np.array([-1.6e-4], dtype=np.float32)
    v = np.array([-1.19], dtype=np.float32)
    res = backend.gae(r, v, gamma=0.99, lam=0.95)
    assert_close(res.returns, gt.gae(r, v, gamma=0.99, lam=0.95).returns, np.float32)
