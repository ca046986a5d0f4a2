"""Warp intrinsics and float bit casts for Numba's CUDA simulator, which has none.

The CUDA kernels scan within a warp with ``cuda.shfl_down_sync``, and the
fast look-back polls with ``cuda.ballot_sync`` and broadcasts with
``cuda.shfl_sync``.  The simulator runs each thread of a block as a Python
thread but provides no warp intrinsics; :func:`install` adds those three,
``syncwarp`` and ``nanosleep`` (the look-back's back-off) to its fake ``cuda`` module, so the simulator runs the very
kernel code that runs on a GPU.  :func:`f32_bits` and :func:`bits_f32` stand
in for libdevice's ``float_as_int`` / ``int_as_float`` (stubs in the
simulator).

A warp is the threads ``32w .. 32w+31`` of a block in linear thread order
(``x`` fastest), as on hardware.  Every lane of the warp must call the
shuffle, with the mask of all the warp's lanes (as the kernels do); each lane posts its
value, waits for the others at a barrier of the warp, reads its source lane's
value and waits again before the slots are reused.  A source lane past the
warp's last thread returns the caller's own value (on hardware the result is
undefined there, and the kernels ignore it).
"""

from __future__ import annotations

import threading
import time

import numpy as np

_FULL_MASK = 0xFFFFFFFF
_TIMEOUT_S = 120.0  # a lane that never arrives is a kernel bug: fail instead of hanging
_lock = threading.Lock()


class _Warp:
    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.barrier = threading.Barrier(lanes, timeout=_TIMEOUT_S)
        self.slots: list = [None] * lanes


def _warp_of_current_thread() -> tuple[_Warp, int]:
    th = threading.current_thread()
    manager = th._manager  # the simulator's BlockManager: one per block
    tid = th.thread_id
    w, lane = divmod(tid, 32)
    with _lock:
        warps = manager.__dict__.setdefault("_gaescan_warps", {})
        warp = warps.get(w)
        if warp is None:
            nthreads = 1
            for n in manager._block_dim:
                nthreads *= n
            warp = warps[w] = _Warp(min(32, nthreads - 32 * w))
    return warp, lane


def _check_mask(mask, warp: _Warp) -> None:
    # The kernels name every lane the warp has: all 32, or the first n of a partial warp.
    if int(mask) not in (_FULL_MASK, (1 << warp.lanes) - 1):
        raise NotImplementedError(f"gaescan's simulator warp intrinsics need the mask of all the warp's "
                                  f"{warp.lanes} lanes, got {int(mask):#x}")


def _shfl_down_sync(self, mask, value, delta):
    warp, lane = _warp_of_current_thread()
    _check_mask(mask, warp)
    warp.slots[lane] = value
    warp.barrier.wait()
    src = lane + delta
    got = warp.slots[src] if src < warp.lanes else value
    warp.barrier.wait()
    return got


def _shfl_sync(self, mask, value, src_lane):
    warp, lane = _warp_of_current_thread()
    _check_mask(mask, warp)
    warp.slots[lane] = value
    warp.barrier.wait()
    src = int(src_lane) % 32
    got = warp.slots[src] if src < warp.lanes else value
    warp.barrier.wait()
    return got


def _ballot_sync(self, mask, predicate):
    warp, lane = _warp_of_current_thread()
    _check_mask(mask, warp)
    warp.slots[lane] = bool(predicate)
    warp.barrier.wait()
    bits = 0
    for i in range(warp.lanes):
        if warp.slots[i]:
            bits |= 1 << i
    warp.barrier.wait()
    return np.uint32(bits)


def f32_bits(x):
    """The bits of a float32 as an int32 (libdevice ``float_as_int``)."""
    return np.array(x, dtype=np.float32).view(np.int32)[()]


def bits_f32(b):
    """The float32 whose bits are the low 32 of ``b`` (libdevice ``int_as_float``)."""
    return np.array(int(b) & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()]


def _syncwarp(self, mask=_FULL_MASK):
    warp, _ = _warp_of_current_thread()
    _check_mask(mask, warp)
    warp.barrier.wait()


def _nanosleep(self, ns):
    # A polling loop's back-off: let the other simulated threads (Python threads) run.
    time.sleep(0)


def install() -> None:
    """Give the simulator's fake ``cuda`` module the warp intrinsics it lacks."""
    from numba.cuda.simulator import kernelapi

    for name, fn in (("shfl_down_sync", _shfl_down_sync), ("shfl_sync", _shfl_sync),
                     ("ballot_sync", _ballot_sync), ("syncwarp", _syncwarp),
                     ("nanosleep", _nanosleep)):
        if not hasattr(kernelapi.FakeCUDAModule, name):
            setattr(kernelapi.FakeCUDAModule, name, fn)
