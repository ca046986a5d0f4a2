"""Random problems through the Numba backend's SIMD-lanes and streaming paths.

The lanes kernels (eight rows or batch columns per vector), the packed lanes
and the non-temporal stores serve large calls only; here their thresholds are
lowered (``SERIAL_MAX_STEPS``, ``STREAM_MIN_BYTES``, the packed ones) so that
small arrays reach them.  Each problem draws its function, shape, features
(flags, masks, next values, per-row coefficients, poisoned entries) and the
layout of every array: C order, Fortran order (time-major memory), rows at an
offset inside wider rows, rows a power of two apart, the whole problem
transposed to ``axis=0``, and ``out`` buffers of any of those layouts.  Every
result is checked against the float64 references of :mod:`gaescan.testing`,
against the same call on one thread (bit for bit, into the same buffers), and
the inputs against their copies.

Marked ``slow`` (CI's slow stage runs it): from a cold kernel cache it compiles
builds the rest of the default suite does not, several minutes on two cores.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from conftest import FLAG_MODES, flag_kwargs, random_cu_seqlens, random_data, snapshot

import gaescan
import gaescan.testing as gt
from gaescan.backends import numba_cpu, turn_gae_numba, vtrace_numba

_NEAR_ONE = float(np.float32(1) - np.float32(2**-24))


@pytest.fixture
def lanes_everywhere(monkeypatch):
    for module in (numba_cpu, vtrace_numba, turn_gae_numba):
        monkeypatch.setattr(module, "SERIAL_MAX_STEPS", 0)
    monkeypatch.setattr(numba_cpu, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(numba_cpu, "PACKED_MIN_MEAN_STEPS", 1)
    monkeypatch.setattr(numba_cpu, "PACKED_MAX_SEQUENCE_SHARE", 1.0)


def _layout(g, x):
    """``x``, or the same numbers in another layout: Fortran order, rows at an
    offset inside wider rows, or rows a power of two apart."""
    k = int(g.integers(0, 4))
    if x.ndim != 2 or k == 0:
        return x
    if k == 1:
        return np.asfortranarray(x)
    R, T = x.shape
    if k == 2:
        off = int(g.integers(1, 17))
        wide = np.zeros((R, T + off + int(g.integers(0, 17))), x.dtype)
    else:
        off = 0
        wide = np.zeros((R, 1 << max(4, (T - 1).bit_length())), x.dtype)
    wide[:, off:off + T] = x
    return wide[:, off:off + T]


def _coef(g, R):
    form = int(g.integers(0, 3))
    if form == 0:
        return float(g.choice([0.0, 0.5, 0.9, 0.99, 0.999, 1.0, _NEAR_ONE]))
    if form == 1:
        return float(g.uniform(0.8, 1.0))
    # Per row; in a quarter of the problems with a zero decay (the carry dropped)
    # in some rows, which takes the calls off the lanes kernels.
    c = g.uniform(0.8, 1.0, (R, 1))
    if g.random() < 0.25:
        c[g.random((R, 1)) < 0.3] = 0.0
    return c.astype(np.float32)


def _poison(g, kw, names):
    """A NaN or an infinity in one input, sometimes: it must stay in its episode."""
    if g.random() < 0.3:
        name = names[int(g.integers(0, len(names)))]
        x = kw[name].copy()
        x[tuple(int(g.integers(0, s)) for s in x.shape)] = g.choice([np.nan, np.inf, -np.inf])
        kw[name] = x


def _problem(g):
    """``(function, reference, keyword arguments, number of outputs)``."""
    R = int(g.choice([8, 9, 15, 16, 17, 24]))
    T = int(g.choice([1, 7, 15, 16, 17, 31, 33, 100, 255, 256, 257, 1000, 3583, 3600, 4099]))
    dtype = np.float32 if g.random() < 0.85 else np.float64
    shape = (R, T)
    r, v = random_data(g, shape, dtype), random_data(g, shape, dtype)
    kind = g.choice(["gae", "gae", "returns", "scan", "vtrace", "vtrace", "turn_gae", "packed"])
    if kind == "packed":
        N, S = int(g.choice([64, 300, 2000, 9000])), int(g.integers(8, 30))
        r1, v1 = random_data(g, (N,), dtype), random_data(g, (N,), dtype)
        kw = dict(rewards=r1, values=v1, gamma=float(g.choice([0.9, 0.99])), lam=float(g.choice([0.95, 1.0])),
                  cu_seqlens=random_cu_seqlens(g, N, S, empty_p=0.1))
        kw.update(flag_kwargs(FLAG_MODES[int(g.integers(0, 5))], g, (N,), v1, p=float(g.choice([0.0, 0.01]))))
        if "next_values" not in kw and g.random() < 0.3:
            kw["mask"] = g.random(N) < 0.8
        _poison(g, kw, ["rewards", "values"])
        return gaescan.gae, gt.gae, kw, 2
    p = float(g.choice([0.0, 0.001, 0.05, 0.5]))
    if kind == "gae":
        fn, ref, n = gaescan.gae, gt.gae, 2
        kw = dict(rewards=r, values=v, gamma=_coef(g, R), lam=_coef(g, R))
        kw.update(flag_kwargs(FLAG_MODES[int(g.integers(0, 5))], g, shape, v, p=p))
        if g.random() < 0.3:
            kw["mask"] = g.random(shape) < float(g.choice([0.5, 0.9, 1.0]))
        if "next_values" not in kw and g.random() < 0.4:
            kw["last_value"] = random_data(g, (R,), dtype)
        _poison(g, kw, ["rewards", "values"])
    elif kind == "returns":
        fn, ref, n = gaescan.discounted_returns, gt.discounted_returns, 1
        kw = dict(rewards=r, gamma=_coef(g, R))
        if g.random() < 0.6:
            kw["dones"] = g.random(shape) < p
        if g.random() < 0.3:
            kw["mask"] = g.random(shape) < 0.8
        _poison(g, kw, ["rewards"])
    elif kind == "scan":
        fn, ref, n = gaescan.linear_scan, gt.linear_scan, 1
        a = g.uniform(0.5, 1.0, shape).astype(dtype) if g.random() < 0.6 else float(g.uniform(0.5, 1.0))
        kw = dict(a=a, b=r, reverse=bool(g.random() < 0.5))
        if g.random() < 0.5:
            kw["initial"] = random_data(g, (R,), dtype)
    elif kind == "vtrace":
        fn, ref, n = gaescan.vtrace, gt.vtrace, 2
        # scale 30 puts some log-ratios outside the float32 exponential's range
        lr = (g.standard_normal(shape) * float(g.choice([0.1, 1.0, 30.0]))).astype(dtype)
        kw = dict(rewards=r, values=v, log_rhos=lr, gamma=_coef(g, R), lam=float(g.choice([1.0, 0.95])),
                  rho_bar=float(g.choice([1.0, 0.8, 2.0])), c_bar=float(g.choice([1.0, 0.9])))
        kw.update(flag_kwargs(FLAG_MODES[int(g.integers(0, 5))], g, shape, v, p=p))
        if g.random() < 0.2:
            kw["mask"] = g.random(shape) < 0.8
        _poison(g, kw, ["rewards", "values", "log_rhos"])
    else:
        fn, ref, n = gaescan.turn_gae, gt.turn_gae, 2
        ids = np.sort(g.integers(0, int(g.integers(1, max(2, T // 4))), shape), axis=1).astype(np.int32)
        kw = dict(rewards=r, values=v, turn_ids=ids, gamma=_coef(g, R), lam=_coef(g, R))
        if g.random() < 0.4:
            kw["mask"] = g.random(shape) < 0.8
        _poison(g, kw, ["rewards", "values"])
    if g.random() < 0.3:  # the problem in time-major memory, as axis=0 of C-contiguous arrays
        kw = {k: np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) and x.ndim == 2 else x for k, x in kw.items()}
        kw["axis"] = 0
    else:
        kw = {k: _layout(g, x) if isinstance(x, np.ndarray) else x for k, x in kw.items()}
    if g.random() < 0.4:
        lead = kw["rewards"] if "rewards" in kw else kw["b"]
        outs = tuple(_layout(g, np.zeros(lead.shape, dtype)) for _ in range(n))
        kw["out"] = outs if n > 1 else outs[0]
    return fn, ref, kw, n


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100))
def test_lanes_and_streams_on_random_layouts(lanes_everywhere, seed):
    for j in range(5):
        g = np.random.default_rng([seed, j])
        fn, ref, kw, n = _problem(g)
        inputs = {k: x for k, x in kw.items() if k != "out"}
        before = snapshot(inputs)
        got = fn(**kw)
        got = tuple(np.array(x, copy=True) for x in (got if n > 1 else (got,)))
        want = ref(**inputs)
        for x, y in zip(got, want if n > 1 else (want,), strict=True):
            gt.assert_close(x, y, dtype=x.dtype)
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            one = fn(**kw)  # into the same buffers: the bits may follow the outputs' offsets in a line
        finally:
            numba.set_num_threads(threads)
        for x, y in zip(got, one if n > 1 else (one,), strict=True):
            assert np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y))
        for name, x in before.items():
            assert np.array_equal(x, kw[name], equal_nan=True), f"{name} modified"
