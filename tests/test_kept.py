"""Kept calls (:mod:`gaescan._kept`): a repeated host call of one structure
runs its replay, which gives the route's bits, and every change the route's
choices depend on takes the route again."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_in_threads

import gaescan
import gaescan.testing as gt
from gaescan import _dispatch, _kept
from gaescan.backends import numba_cpu


@pytest.fixture
def routes(monkeypatch):
    """Count the calls that take the route (reach the dispatcher's entry point)."""
    _kept.clear()
    count = [0]
    real = _dispatch.run_gae

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_dispatch, "run_gae", counted)
    yield count
    _kept.clear()


def _case(rng, R=5, T=301, dtype=np.float32):
    r = rng.standard_normal((R, T)).astype(dtype)
    v = rng.standard_normal((R, T)).astype(dtype)
    d = rng.random((R, T)) < 0.05
    return r, v, d


def _routed(f):
    """``f()`` computed by the route, with nothing kept."""
    saved = dict(_kept.KEPT)
    _kept.clear()
    try:
        return f()
    finally:
        _kept.KEPT.clear()
        _kept.KEPT.update(saved)


def _same_bits(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


_FLAG_CASES = {
    "dones": lambda r, v, d, m: dict(dones=d),
    "uint8-dones": lambda r, v, d, m: dict(dones=d.view(np.uint8)),
    "plain": lambda r, v, d, m: {},
    "mask": lambda r, v, d, m: dict(dones=d, mask=m),
    "mask-only": lambda r, v, d, m: dict(mask=m),
    "next": lambda r, v, d, m: dict(next_values=v[:, ::-1].copy(), terminated=d, truncated=~m),
    "next-term": lambda r, v, d, m: dict(next_values=v + 1, terminated=d),
    "next-plain": lambda r, v, d, m: dict(next_values=v * 0.5),
}


@pytest.mark.parametrize("case", list(_FLAG_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("R", "T"), [(1, 1), (3, 17), (8, 1024), (3, numba_cpu.SERIAL_MAX_STEPS // 3 + 7)])
def test_kept_call_gives_the_route_bits(routes, rng, case, dtype, R, T):
    r, v, d = _case(rng, R, T, dtype)
    m = rng.random((R, T)) < 0.8
    kw = _FLAG_CASES[case](r, v, d, m)
    kw.update(gamma=0.99, lam=0.95)
    first = gaescan.gae(r, v, **kw)
    assert routes[0] == 1 and len(_kept.KEPT) == 1
    # new data of the same structure: the replay runs
    r2, v2, d2 = _case(rng, R, T, dtype)
    kw2 = _FLAG_CASES[case](r2, v2, d2, rng.random((R, T)) < 0.8)
    kw2.update(gamma=0.99, lam=0.95)
    snap = {k: x.copy() for k, x in kw2.items() if isinstance(x, np.ndarray)}
    again = gaescan.gae(r2, v2, **kw2)
    assert routes[0] == 1
    _same_bits(again, _routed(lambda: gaescan.gae(r2, v2, **kw2)))
    ref = gt.gae(r2, v2, **kw2)
    gt.assert_close(again.advantages, ref.advantages, dtype=dtype)
    gt.assert_close(again.returns, ref.returns, dtype=dtype)
    for k, x in snap.items():  # inputs are never modified
        np.testing.assert_array_equal(kw2[k], x)
    # fresh outputs each call, sharing no memory with an earlier result
    third = gaescan.gae(r2, v2, **kw2)
    _same_bits(third, again)
    for x in third:
        for y in (*first, *again):
            assert not np.shares_memory(x, y)


def test_each_part_of_the_structure_is_in_the_key(routes, rng):
    r, v, d = _case(rng)
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    assert routes[0] == 1
    variants = [
        lambda: gaescan.gae(r, v, gamma=0.98, lam=0.95, dones=d),              # γ
        lambda: gaescan.gae(r, v, gamma=0.99, lam=0.9, dones=d),               # λ
        lambda: gaescan.gae(r[:, ::2], v[:, ::2], gamma=0.99, lam=0.95, dones=d[:, ::2]),  # strides, shape
        lambda: gaescan.gae(r[:4], v[:4], gamma=0.99, lam=0.95, dones=d[:4]),  # rows
        lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, terminated=d),         # which flag
        lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d.astype(np.uint8)),  # flag dtype
        lambda: gaescan.gae(r.astype(np.float64), v, gamma=0.99, lam=0.95, dones=d),  # data dtype
        lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="numba"),  # backend name
        lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, axis=1),      # axis spelling
    ]
    for k, f in enumerate(variants):
        before = routes[0]
        got = f()
        assert routes[0] == before + 1, f"variant {k} replayed another structure's call"
        _same_bits(got, _routed(f))


@pytest.mark.parametrize("call", [
    "out", "last_value", "last_advantage", "zero-gamma", "zero-lam", "numpy-scalar-gamma", "cu_seqlens",
    "float16", "int-flags", "time-major", "backend-numpy", "3-d",
])
def test_calls_that_are_not_kept_take_the_route_every_time(routes, rng, call):
    r, v, d = _case(rng)
    kw = dict(gamma=0.99, lam=0.95, dones=d)
    if call == "out":
        kw["out"] = (np.empty_like(r), np.empty_like(r))
    elif call == "last_value":
        kw["last_value"] = 0.5
    elif call == "last_advantage":
        kw["last_advantage"] = np.ones(r.shape[0], np.float32)
    elif call == "zero-gamma":
        kw["gamma"] = -0.0  # equal to 0.0 as a key, not in the bits
    elif call == "zero-lam":
        kw["lam"] = 0.0
    elif call == "numpy-scalar-gamma":
        kw["gamma"] = np.float32(0.99)
    elif call == "cu_seqlens":
        r, v, kw = r.reshape(-1), v.reshape(-1), dict(gamma=0.99, lam=0.95, cu_seqlens=np.array([0, 7, r.size]))
    elif call == "float16":
        r = r.astype(np.float16)
    elif call == "int-flags":
        kw["dones"] = d.astype(np.int32)
    elif call == "time-major":
        r, v, kw["dones"] = (np.ascontiguousarray(x.T) for x in (r, v, d))
        kw["axis"] = 0
    elif call == "backend-numpy":
        kw["backend"] = "numpy"
    elif call == "3-d":
        r, v, kw["dones"] = (x.reshape(5, 7, 43) for x in (r, v, d))
    for n in range(1, 4):
        got = gaescan.gae(r, v, **kw)
        assert routes[0] == n
    assert not _kept.KEPT
    ref = gt.gae(r, v, **{k: x for k, x in kw.items() if k not in ("out", "backend")})
    gt.assert_close(got.advantages, ref.advantages, dtype=np.float32)


def test_bad_arguments_still_raise_after_a_call_is_kept(routes, rng):
    r, v, d = _case(rng)
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    assert routes[0] == 1
    with pytest.raises(ValueError, match="gamma"):
        gaescan.gae(r, v, gamma=1.5, lam=0.95, dones=d)
    with pytest.raises(ValueError, match="gamma"):
        gaescan.gae(r, v, gamma=float("nan"), lam=0.95, dones=d)
    with pytest.raises(ValueError, match="shape"):
        gaescan.gae(r, v[:, 1:], gamma=0.99, lam=0.95, dones=d)
    with pytest.raises(ValueError, match="dones"):
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, terminated=d)
    with pytest.raises(ValueError, match="backend"):
        gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d, backend="nope")
    with pytest.raises(TypeError, match="masked"):
        gaescan.gae(np.ma.masked_array(r), v, gamma=0.99, lam=0.95, dones=d)


def test_a_changed_setting_takes_the_route_and_keeps_the_new_choice(routes, rng, monkeypatch):
    R, T = 4, 1000
    r, v, d = _case(rng, R, T)
    first = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    assert routes[0] == 1
    # the thread pool's kernel: another build, the same bits
    monkeypatch.setattr(numba_cpu, "SERIAL_MAX_STEPS", R * T - 1)
    _same_bits(gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d), first)
    assert routes[0] == 2
    gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    assert routes[0] == 2
    # a float64 state for γλ = 0.9405: the route's bits, not the kept float32-state ones
    monkeypatch.setattr(numba_cpu, "F32_STATE_MAX_DECAY", 0.5)
    wide = gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)
    assert routes[0] == 3
    _same_bits(wide, _routed(lambda: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)))


@pytest.mark.parametrize("steps", ["serial", "parallel"])
def test_kept_calls_from_threads(routes, rng, steps):
    R, T = (8, 1024) if steps == "serial" else (8, numba_cpu.SERIAL_MAX_STEPS // 8 + 64)
    data = [_case(np.random.default_rng(k), R, T) for k in range(4)]
    want = [_routed(lambda r=r, v=v, d=d: gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d)) for r, v, d in data]
    gaescan.gae(*data[0][:2], gamma=0.99, lam=0.95, dones=data[0][2])

    def work(k):
        for _ in range(20):
            r, v, d = data[k % 4]
            _same_bits(gaescan.gae(r, v, gamma=0.99, lam=0.95, dones=d), want[k % 4])

    errors = run_in_threads(work)
    assert not errors, errors
    assert routes[0] == 1 + 4  # the routed references and the one kept call


def test_the_kept_table_is_bounded(routes, rng):
    r, v, d = _case(rng, 2, 9)
    for k in range(_kept.KEPT_MAX + 5):
        gaescan.gae(r, v, gamma=0.5 + k / 1000, lam=0.95, dones=d)
    assert 0 < len(_kept.KEPT) <= _kept.KEPT_MAX
