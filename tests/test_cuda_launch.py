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
