"""Host-side launch glue of the CUDA backend that runs without a GPU.

The kernels themselves are tested in the simulator (``test_cuda_sim.py``) and
compiled to PTX (``test_ptx.py``); a GPU session runs ``gaescan gpu-check``.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip("launch glue of the real-GPU path (the simulator launches differently)",
                allow_module_level=True)

cb = pytest.importorskip("gaescan.backends.cuda")


class _Compiled:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def launch(self, *a):
        self.calls.append(a)


class _Dispatcher:
    def __init__(self, n: int) -> None:
        self.overloads = {f"sig{i}": _Compiled() for i in range(n)}


def test_direct_launch_launches_the_one_compiled_kernel(monkeypatch):
    monkeypatch.setattr(cb, "_core_stream", lambda ptr: ("stream", ptr))
    d = _Dispatcher(1)
    args = (object(), 1.5, 7)
    cb._launch_direct(d, args, 9, (4, 32), 1234)
    cb._launch_direct(d, args, 2, (1, 128), 0)
    (k,) = d.overloads.values()
    # What dispatcher[grid, block, stream](*args) would launch: 3-D dims, no dynamic shared memory.
    assert k.calls == [(args, (9, 1, 1), (4, 32, 1), ("stream", 1234), 0),
                       (args, (2, 1, 1), (1, 128, 1), ("stream", 0), 0)]


@pytest.mark.parametrize("n", [0, 2])
def test_direct_launch_refuses_a_dispatcher_without_exactly_one_kernel(monkeypatch, n):
    monkeypatch.setattr(cb, "_core_stream", lambda ptr: ptr)
    with pytest.raises(RuntimeError, match="exactly one signature.*direct_launch"):
        cb._launch_direct(_Dispatcher(n), (), 1, (1, 1), 0)


class _Kernel:
    @staticmethod
    def py_func():
        pass


@pytest.fixture
def compiles(monkeypatch):
    """Every explicit-signature compile ``_typed`` asks for, as (signature, options); none runs."""
    seen = []

    def fake_jit(sig, **kw):
        seen.append((sig, kw))
        return lambda f: ("compiled", len(seen))

    monkeypatch.setattr(cb.cuda, "jit", fake_jit)
    monkeypatch.setattr(cb, "_typed_cache", {})
    return seen


@pytest.mark.parametrize("threads,min_blocks,bounds", [(128, 0, None), (256, 0, None), (512, 0, (512, 1)),
                                                       (1024, 0, (1024, 1)), (128, 6, (128, 6))])
def test_typed_kernels_get_launch_bounds_where_a_block_needs_them(compiles, threads, min_blocks, bounds):
    # Unbounded, ptxas may give a kernel more registers than a block of more than 256
    # threads can have (65536 per SM), and the launch fails: those are always bounded.
    import numpy as np

    args = tuple(np.zeros((2, 2), np.float32) for _ in range(cb._N_ARRAYS)) + (np.float32(1), np.int64(2))
    key = (0, 1, False, "<f4", threads, 8, 0)
    assert cb._typed(_Kernel, key, args, min_blocks) == ("compiled", 1)
    assert [kw.get("launch_bounds") for _, kw in compiles] == [bounds]


@pytest.mark.parametrize("contiguous", [False, True])
def test_contiguous_typing_types_all_arrays_c_only_when_all_are(compiles, contiguous):
    import numpy as np

    c_args = tuple(np.zeros((2, 4), np.float32) for _ in range(cb._N_ARRAYS)) + (np.float32(1), np.int64(2))
    strided = (np.zeros((2, 8), np.float32)[:, ::2],) + c_args[1:]
    broadcast = c_args[:5] + (np.broadcast_to(np.float32(0.9), (2, 4)),) + c_args[6:]
    key = (0, 1, False, "<f4", 128, 8, 0)
    k_c = cb._typed(_Kernel, key, c_args, 0, contiguous)
    k_s = cb._typed(_Kernel, key, strided, 0, contiguous)
    k_b = cb._typed(_Kernel, key, broadcast, 0, contiguous)
    layouts = [{a.layout for a in sig.args if hasattr(a, "layout")} for sig, _ in compiles]
    if contiguous:
        # All C-contiguous: a kernel typed "C" throughout; any strided array: the "A" kernel.
        assert layouts == [{"C"}, {"A"}] and k_c != k_s and k_s == k_b
    else:
        assert layouts == [{"A"}] and k_c == k_s == k_b
