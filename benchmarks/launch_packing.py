"""Host cost of preparing one CUDA launch's parameters, without a GPU.

The ``raw_launch`` tunable of the CUDA backend flattens the 24 kernel arguments
(12 problem arrays, 9 scalars, 3 look-back buffers, as in a GAE call of B=8,
T=1024) into Numba's kernel ABI and packs them into one buffer.  Numba's own
launch prepares the same values argument by argument (``_Kernel._prepare_args``)
and then hands them to cuda.core, which converts them again.  Here both run on
the CPU with the device
arrays stubbed (same pointers, shapes and strides) and the driver call replaced by
a no-op, so this measures Python work only, and of Numba only the first of its
steps (no launch configuration, no cuda.core conversion, no dispatcher typing):
a lower bound on what the raw launch saves.  Medians of 7 runs of 20000 calls.

    python benchmarks/launch_packing.py
"""

from __future__ import annotations

import statistics
import sys
import time
from types import ModuleType, SimpleNamespace

import numba.cuda.dispatcher as disp
import numpy as np
from numba.core import types

from gaescan.backends import cuda as cb


class _CupyLike:
    def __init__(self, ptr: int, shape: tuple, itemsize: int) -> None:
        self.data = SimpleNamespace(ptr=ptr)
        self.shape, self.itemsize = shape, itemsize
        self.strides = tuple(itemsize * int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.size = int(np.prod(shape))


class _Placeholder:
    def __init__(self, ptr: int, ndim: int) -> None:
        self.__cuda_array_interface__ = {"shape": (1,) * ndim, "typestr": "<f4", "data": (ptr, False),
                                         "strides": None, "version": 3}


def _arguments() -> tuple[tuple, tuple]:
    # gae(r, v, dones=d, out=(adv, ret)) on (8, 1024): five arrays, the rest placeholders.
    ndims = [2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 2, 2]
    real = {0: (4, 0x1000), 1: (4, 0x2000), 3: (1, 0x3000), 10: (4, 0x4000), 11: (4, 0x5000)}
    args: list = []
    for i, nd in enumerate(ndims):
        if i in real:
            args.append(_CupyLike(real[i][1], (8, 1024), real[i][0]))
        else:
            args.append(_Placeholder(0x9000 + 16 * i, nd))
    args += [np.float32(0.99), np.float32(0.95), np.float32(0.0)] + [np.int64(x) for x in (0, 8, 1024, 8, 1, 128)]
    args += [_Placeholder(0xA000 + 16 * j, 1) for j in range(3)]
    for i, a in enumerate(args):
        if isinstance(a, _Placeholder):
            cb._dummies[("bench", i)] = a
    sig = tuple([types.Array(types.float32, nd, "A") for nd in ndims] + [types.float32] * 3
                + [types.int64] * 6 + [types.Array(types.float32, 1, "A")] * 3)
    return tuple(args), sig


def _median_us(f, n: int = 20000) -> float:
    for _ in range(1000):
        f()
    runs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    args, sig = _arguments()
    cupy = ModuleType("cupy")
    cupy.cuda = SimpleNamespace(driver=SimpleNamespace(launchKernel=lambda *a: None))
    sys.modules["cupy"] = cupy  # the driver call: a no-op
    compiled = SimpleNamespace(argument_types=sig,
                               _codelibrary=SimpleNamespace(get_cufunc=lambda: SimpleNamespace(handle=1)))

    class Dispatcher:
        overloads = {"sig": compiled}

    d = Dispatcher()

    def raw() -> None:
        cb._launch_raw(d, 0, args, 8, (1, 128), 0)

    def stub(x):
        if isinstance(x, _CupyLike):
            return SimpleNamespace(size=x.size, dtype=np.dtype(f"u{x.itemsize}"), ptr=x.data.ptr, shape=x.shape,
                                   _layout=SimpleNamespace(strides_in_bytes=x.strides))
        cai = x.__cuda_array_interface__
        return SimpleNamespace(size=1, dtype=np.dtype(np.float32), ptr=cai["data"][0], shape=cai["shape"],
                               _layout=SimpleNamespace(strides_in_bytes=(4,) * len(cai["shape"])))

    devs = {id(a): stub(a) for a in args if not isinstance(a, np.generic)}
    disp.wrap_arg = lambda v: SimpleNamespace(to_device=lambda retr, stream: devs[id(v)])
    kself = SimpleNamespace(extensions=[])

    def numba_prepare() -> None:
        out: list = []
        for t, v in zip(sig, args, strict=True):
            disp._Kernel._prepare_args(kself, t, v, 0, [], out)

    print("host work per launch of a GAE kernel (24 arguments, 134 parameters), CPU only:")
    for _ in range(3):
        a, b = _median_us(raw), _median_us(numba_prepare)
        print(f"  raw_launch flatten + pack + (no-op) driver call: {a:6.2f} us   "
              f"Numba _prepare_args alone: {b:6.2f} us   ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
