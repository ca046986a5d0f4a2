"""CUDA graphs: memory that calls captured into a graph must keep.

A graph keeps the addresses it was captured with and may be replayed at any
time, so memory a captured call allocated (look-back records, conversions,
outputs gaescan allocated) never goes back to the pool.  Used by the calls on
device arrays (:meth:`gaescan._arrays.Context.stream`) and by the ``"cuda"``
backend's look-back scratch.  CuPy is imported when a function runs: only
calls on device arrays get here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: Memory allocated by calls captured into CUDA graphs, kept for the life of the process.
CAPTURED: list[Any] = []

# cudaErrorStreamCaptureImplicit: the legacy stream was queried while another
# stream captures (so the call, on the legacy stream, is not being captured).
_CAPTURE_IMPLICIT = 906


def stream_capturing(ptr: int) -> bool:
    """Whether the CUDA stream ``ptr`` is capturing a graph (a query, not a synchronisation)."""
    import cupy as cp

    try:
        return bool(cp.cuda.runtime.streamIsCapturing(ptr))
    except cp.cuda.runtime.CUDARuntimeError as exc:
        if getattr(exc, "status", None) == _CAPTURE_IMPLICIT:
            return False
        raise


@contextlib.contextmanager
def keeping_if_captured(ptr: int) -> Iterator[None]:
    """While stream ``ptr`` captures a CUDA graph, keep what is allocated inside.

    CuPy's stream-ordered pool (``MemoryAsyncPool``) needs nothing: under capture
    its allocations and frees become nodes of the graph itself.  Any other
    allocator's memory is kept in :data:`CAPTURED`, and is taken with the
    thread's capture mode relaxed, as PyTorch's allocator does: in the default
    ("global") mode of ``torch.cuda.graph`` CUDA refuses ``cudaMalloc`` during
    capture, and a pool that keeps its blocks will need new ones.
    """
    if not stream_capturing(ptr):
        yield
        return
    import cupy as cp

    malloc = cp.cuda.get_allocator()
    if isinstance(getattr(malloc, "__self__", None), getattr(cp.cuda, "MemoryAsyncPool", ())):
        yield
        return
    with cp.cuda.using_allocator(_kept(malloc)):
        yield


def _kept(malloc: Any) -> Any:
    """``malloc``, with the capture mode relaxed, keeping every allocation in :data:`CAPTURED`."""
    def kept(size: int) -> Any:
        with _relaxed_capture():
            mem = malloc(size)
        CAPTURED.append(mem)
        return mem
    return kept


@contextlib.contextmanager
def _relaxed_capture() -> Iterator[None]:
    """This thread's stream-capture mode set to relaxed (cudaThreadExchangeStreamCaptureMode)."""
    from cuda.bindings import runtime as rt  # the CUDA Python bindings numba-cuda depends on

    err, prev = rt.cudaThreadExchangeStreamCaptureMode(rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaThreadExchangeStreamCaptureMode failed: {err}")
    try:
        yield
    finally:
        rt.cudaThreadExchangeStreamCaptureMode(prev)
