"""Every step of a call that can queue device work runs inside the caller's stream.

For PyTorch CUDA tensors, :meth:`gaescan._arrays.Context.stream` makes PyTorch's
current stream CuPy's current stream.  Conversions (an int64 copy of int32
``cu_seqlens``, reshape copies), output allocations and the launch must all run
inside it: PyTorch's side streams are non-blocking, so a copy queued on CuPy's
default stream would not be ordered before a kernel on the caller's stream.
No GPU is needed to check the structure: the stream context is replaced by one
that records when it is entered, and the steps record whether they ran in it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import gaescan
from gaescan import _arrays, _dispatch
from gaescan import _validate as v


@pytest.fixture
def steps(monkeypatch):
    """``(step name, inside the stream context)`` for every step of the calls made."""
    depth = [0]
    seen: list[tuple[str, bool]] = []

    @contextlib.contextmanager
    def stream(self):
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def spy(name, fn):
        def wrapped(*a, **k):
            seen.append((name, depth[0] > 0))
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(_arrays.Context, "stream", stream)
    for name in ("to_compute", "from_compute"):
        monkeypatch.setattr(_arrays.Context, name, spy(name, getattr(_arrays.Context, name)))
    for name in ("packed_offsets", "outputs", "coefficient", "boundary_value", "finish"):
        monkeypatch.setattr(v, name, spy(name, getattr(v, name)))
    real_load = _dispatch.load

    class _Spied:
        def __init__(self, mod):
            self.mod = mod

        def __getattr__(self, fn):
            return spy(f"backend.{fn}", getattr(self.mod, fn))

    monkeypatch.setattr(_dispatch, "load", lambda name: _Spied(real_load(name)))
    return seen


def _data(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bk", ["numba", "numpy"])
def test_calls_do_all_their_work_in_the_callers_stream(steps, bk):
    rng = np.random.default_rng(0)
    r, val = _data(rng, (2, 7, 5)), _data(rng, (2, 7, 5))
    d = rng.random((2, 7, 5)) < 0.2
    cu = np.array([0, 3, 3, 5], np.int32)  # int32 offsets: the CUDA path copies them to int64
    g = np.full((2, 1, 5), 0.9, np.float32)
    gaescan.gae(r, val, gamma=g, lam=0.95, dones=d, last_value=_data(rng, (2, 5)), axis=1, backend=bk)
    gaescan.gae(r[0, 0, :], val[0, 0, :], gamma=0.9, lam=0.95, cu_seqlens=cu, backend=bk)
    gaescan.discounted_returns(r, gamma=g, dones=d, axis=1, backend=bk)
    gaescan.discounted_returns(r[1, 1, :], gamma=0.9, cu_seqlens=cu, backend=bk)
    gaescan.linear_scan(g, r, axis=1, initial=0.5, backend=bk)
    s = [gaescan.gae_summary(r[..., :2], val[..., :2], gamma=0.9, lam=0.95, backend=bk),
         gaescan.gae_summary(r[..., 2:], val[..., 2:], gamma=0.9, lam=0.95, backend=bk)]
    gaescan.carry_in(s)
    gaescan.returns_summary(r, gamma=0.9, backend=bk)
    gaescan.scan_summary(g, r, backend=bk)
    gaescan.bootstrap_summary(val)
    names = {n for n, _ in steps}
    assert {"to_compute", "from_compute", "packed_offsets", "outputs", "coefficient", "boundary_value",
            "finish", "backend.gae", "backend.discounted_returns", "backend.linear_scan"} <= names
    outside = sorted({n for n, inside in steps if not inside})
    assert not outside, f"run outside the caller's stream: {outside}"
