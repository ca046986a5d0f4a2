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
import sys

import numpy as np
import pytest

import gaescan
from gaescan import _arrays, _dispatch
from gaescan import _validate as v
from gaescan.backends import _cuda_graphs


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
    gaescan.linear_scan(0.5, r[0].tolist(), backend=bk)  # an array-like: converted in the stream
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


# --------------------------------------------------------------------------- CUDA graph capture


class _RuntimeError(Exception):
    def __init__(self, status):
        super().__init__(f"CUDA error {status}")
        self.status = status


@pytest.fixture
def fake_cupy(monkeypatch):
    """Just the parts of CuPy that ``Context.stream`` uses; ``state`` drives them."""
    from types import SimpleNamespace

    state = {"capturing": False, "relaxed": False, "queried": []}

    def malloc(size):
        return ("mem", size, "relaxed" if state["relaxed"] else "global")

    state["allocator"] = malloc

    @contextlib.contextmanager
    def using_allocator(fn):
        old, state["allocator"] = state["allocator"], fn
        try:
            yield
        finally:
            state["allocator"] = old

    @contextlib.contextmanager
    def relaxed():
        state["relaxed"] = True
        try:
            yield
        finally:
            state["relaxed"] = False

    def is_capturing(ptr):
        state["queried"].append(ptr)
        if isinstance(state["capturing"], Exception):
            raise state["capturing"]
        return state["capturing"]

    cuda = SimpleNamespace(
        get_current_stream=lambda: SimpleNamespace(ptr=77),
        runtime=SimpleNamespace(streamIsCapturing=is_capturing, CUDARuntimeError=_RuntimeError),
        get_allocator=lambda: state["allocator"],
        using_allocator=using_allocator,
        MemoryAsyncPool=type("MemoryAsyncPool", (), {"malloc": lambda self, size: ("async", size)}),
    )
    monkeypatch.setitem(__import__("sys").modules, "cupy", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(_cuda_graphs, "_relaxed_capture", relaxed)
    n = len(_cuda_graphs.CAPTURED)
    yield state
    del _cuda_graphs.CAPTURED[n:]


@pytest.mark.parametrize("capturing", [False, True])
def test_a_captured_call_keeps_the_memory_it_allocates(fake_cupy, capturing):
    # A CUDA graph keeps the addresses it was captured with: memory a captured call
    # allocated must never go back to the pool, where another array would get it.
    # It is taken in relaxed capture mode: torch.cuda.graph's default mode refuses
    # cudaMalloc, which a pool that cannot reuse its blocks will need.
    fake_cupy["capturing"] = capturing
    n = len(_cuda_graphs.CAPTURED)
    base = fake_cupy["allocator"]
    with _arrays.Context("cupy", True).stream():
        mem = fake_cupy["allocator"](256)
    assert fake_cupy["queried"] == [77]  # the stream the call runs on
    if capturing:
        assert mem == ("mem", 256, "relaxed") and _cuda_graphs.CAPTURED[n:] == [mem]
    else:
        assert mem == ("mem", 256, "global") and _cuda_graphs.CAPTURED[n:] == []
    assert fake_cupy["allocator"] is base  # restored after the call


def test_a_stream_ordered_pool_needs_no_keeping(fake_cupy):
    # CuPy's MemoryAsyncPool allocates and frees in stream order: captured, both
    # become nodes of the graph, and keeping the memory would stop its relaunch.
    pool = sys.modules["cupy"].cuda.MemoryAsyncPool()
    fake_cupy["allocator"] = pool.malloc
    fake_cupy["capturing"] = True
    n = len(_cuda_graphs.CAPTURED)
    with _arrays.Context("cupy", True).stream():
        assert fake_cupy["allocator"] == pool.malloc  # not wrapped
    assert _cuda_graphs.CAPTURED[n:] == []


def test_only_the_legacy_streams_capture_error_means_not_capturing(fake_cupy):
    # Querying the legacy stream while another stream captures is CUDA error 906:
    # the call (on the legacy stream) is not captured.  Any other error is real.
    fake_cupy["capturing"] = _RuntimeError(906)
    assert _cuda_graphs.stream_capturing(0) is False
    fake_cupy["capturing"] = _RuntimeError(901)  # e.g. a capture invalidated
    with pytest.raises(_RuntimeError):
        _cuda_graphs.stream_capturing(77)
