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


def test_typed_kernels_type_every_array_a_so_layouts_share_one_kernel(compiles):
    import numpy as np

    c_args = tuple(np.zeros((2, 4), np.float32) for _ in range(cb._N_ARRAYS)) + (np.float32(1), np.int64(2))
    strided = (np.zeros((2, 8), np.float32)[:, ::2],) + c_args[1:]
    broadcast = c_args[:5] + (np.broadcast_to(np.float32(0.9), (2, 4)),) + c_args[6:]
    key = (0, 1, False, "<f4", 256, 8, 0)
    kernels = {cb._typed(_Kernel, key, x, 0) for x in (c_args, strided, broadcast)}
    assert len(kernels) == 1
    assert [{a.layout for a in sig.args if hasattr(a, "layout")} for sig, _ in compiles] == [{"A"}]


# --------------------------------------------------------------------------- raw launch


class _CupyLike:
    """What the raw launch reads of a CuPy array (``data.ptr`` is the first element's address)."""

    def __init__(self, ptr, shape, strides, itemsize) -> None:
        from types import SimpleNamespace

        self.data = SimpleNamespace(ptr=ptr)
        self.shape, self.strides, self.itemsize = shape, strides, itemsize
        self.size = 1
        for n in shape:
            self.size *= n


def test_flat_array_is_what_numba_passes_for_an_array(monkeypatch):
    # Numba's own argument preparation, given a device array with the same pointer,
    # shape and strides, must produce the values the raw launch packs.
    import ctypes

    import numba.cuda.dispatcher as disp
    import numpy as np
    from numba.core import types

    if not hasattr(getattr(disp, "_Kernel", None), "_prepare_args"):
        pytest.skip("this numba-cuda prepares kernel arguments elsewhere")
    from types import SimpleNamespace

    x = _CupyLike(0x7F0000001000, (3, 5), (40, -8), 8)
    # A device array as numba-cuda reads it (ptr, _layout) and as Numba's own CUDA
    # target does (CUDA memory with a ctypes pointer, ndim, strides).
    dev = SimpleNamespace(size=15, dtype=np.dtype(np.float64), ptr=0x7F0000001000, shape=(3, 5),
                          _layout=SimpleNamespace(strides_in_bytes=(40, -8)), ndim=2, strides=(40, -8),
                          __cuda_memory__=True, device_ctypes_pointer=ctypes.c_void_p(0x7F0000001000))
    monkeypatch.setattr(disp, "wrap_arg", lambda v: SimpleNamespace(to_device=lambda retr, stream: dev))
    got: list = []
    disp._Kernel._prepare_args(SimpleNamespace(extensions=[]), types.Array(types.float64, 2, "A"), x, 0, [], got)
    # Plain ints (numba-cuda) or ctypes values (Numba's own target; a NULL pointer is None).
    got = [getattr(v, "value", v) or 0 for v in got]
    assert tuple(got) == cb.flat_array(x) == (0, 0, 15, 8, 0x7F0000001000, 3, 5, 40, -8)


def test_flat_array_of_an_array_interface_object():
    class Cai:
        __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (4096, False),
                                    "strides": None, "version": 3}

    assert cb.flat_array(Cai()) == (0, 0, 6, 4, 4096, 2, 3, 12, 4)


def test_flat_array_remembers_only_the_placeholders(monkeypatch):
    class Cai:
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {"shape": (1,), "typestr": "|b1", "data": (ptr, False),
                                             "strides": None, "version": 3}

    dummy, other = Cai(512), Cai(1024)
    monkeypatch.setattr(cb, "_dummies", {("dev", "b1", 1): dummy})
    monkeypatch.setattr(cb, "_flat_cache", {})
    assert cb.flat_array(dummy) == (0, 0, 1, 1, 512, 1, 1) and cb.flat_array(other)[4] == 1024
    dummy.__cuda_array_interface__ = other.__cuda_array_interface__ = None  # no longer readable
    assert cb.flat_array(dummy)[4] == 512
    with pytest.raises(TypeError):
        cb.flat_array(other)


class _RawCompiled:
    """A compiled kernel as the raw launch reads it: its argument types and driver handle."""

    def __init__(self, argument_types) -> None:
        from types import SimpleNamespace

        self.argument_types = argument_types
        self._codelibrary = SimpleNamespace(get_cufunc=lambda: SimpleNamespace(handle=0xABC))


class _RawDispatcher:
    def __init__(self, overloads) -> None:
        self.overloads = overloads


def test_raw_launch_packs_every_parameter_in_one_buffer(monkeypatch):
    import ctypes
    import struct
    import sys
    from types import ModuleType, SimpleNamespace

    import numpy as np
    from numba.core import types

    calls = []

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        # The driver copies the parameters during the call: read them now.
        words = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(words[3]).value
        calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream, params),
                      (words[0], words[2], words[4]), ctypes.string_at(words[1], size)))

    cupy = ModuleType("cupy")
    cupy.cuda = SimpleNamespace(driver=SimpleNamespace(launchKernel=launch_kernel))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(cb, "_raw_kernels", {})
    sig = (types.Array(types.float32, 2, "A"), types.float32, types.int64, types.Array(types.uint64, 1, "A"))
    d = _RawDispatcher({"sig": _RawCompiled(sig)})
    a = _CupyLike(0x1000, (2, 7), (28, 4), 4)
    b = _CupyLike(0x2000, (9,), (8,), 8)
    cb._launch_raw(d, 0, (a, np.float32(0.5), np.int64(-3), b), 12, (1, 128), 777)
    cb._launch_raw(d, 0, (a, np.float32(2.0), np.int64(4), b), 3, (4, 32), 0)
    fmt = "@" + "q" * 9 + "f" + "q" + "q" * 7
    assert cb.param_format(sig) == fmt and struct.calcsize(fmt) == 72 + 4 + 4 + 8 + 56  # 4 bytes of padding
    (l1, x1, p1), (l2, x2, p2) = calls
    assert l1 == (0xABC, 12, 1, 1, 1, 128, 1, 0, 777, 0) and l2 == (0xABC, 3, 1, 1, 4, 32, 1, 0, 0, 0)
    # CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END (NULL).
    assert x1 == x2 == (1, 2, None)
    assert struct.unpack(fmt, p1) == (0, 0, 14, 4, 0x1000, 2, 7, 28, 4, 0.5, -3, 0, 0, 9, 8, 0x2000, 9, 8)
    assert struct.unpack(fmt, p2)[9:11] == (2.0, 4)


def test_raw_launch_refuses_a_dispatcher_without_exactly_one_kernel(monkeypatch):
    import sys
    from types import ModuleType

    monkeypatch.setitem(sys.modules, "cupy", ModuleType("cupy"))
    monkeypatch.setattr(cb, "_raw_kernels", {})
    with pytest.raises(RuntimeError, match="exactly one signature.*raw_launch"):
        cb._launch_raw(_RawDispatcher({}), 0, (), 1, (1, 1), 0)


def test_raw_launch_refuses_a_parameter_it_cannot_pack():
    from numba.core import types

    with pytest.raises(TypeError, match="complex128.*raw_launch"):
        cb.param_format((types.complex128,))


def test_raw_launch_hands_the_callers_arrays_to_the_launch(monkeypatch):
    # The whole host path of a call with raw_launch on, the GPU faked: the problem's own
    # arrays reach the launch (no device-array views), with the placeholders for the rest.
    import numpy as np

    from gaescan._problem import GAEProblem, Rows

    seen = {}
    monkeypatch.setattr(cb, "is_simulator", lambda: False)
    monkeypatch.setattr(cb.cuda, "get_current_device", lambda: type("D", (), {"id": 0})())
    monkeypatch.setattr(cb, "_dummy", lambda dev, dtype, ndim: ("dummy", np.dtype(dtype).str, ndim))
    monkeypatch.setattr(cb, "current_stream_ptr", lambda: 4242)
    monkeypatch.setattr(cb, "_typed", lambda kernel, key, args, *a: ("typed", key))
    monkeypatch.setattr(cb.kern, "get_kernel", lambda *a: "kernel")

    def launch(kernel, dev, args, grid, block, ptr):
        seen.update(kernel=kernel, dev=dev, args=args, grid=grid, block=block, ptr=ptr)

    monkeypatch.setattr(cb, "_launch_raw", launch)
    R, T = 4, 3000
    r, v = np.zeros((R, T), np.float32), np.ones((R, T), np.float32)
    d = np.zeros((R, T), np.bool_)
    adv, ret = np.empty((R, T), np.float32), np.empty((R, T), np.float32)
    p = GAEProblem(rows=Rows(xp=np, dtype=np.dtype(np.float32), R=R, T=T, cu_seqlens=None, nseg=R),
                   rewards=r, values=v, next_values=None, terminated=d, truncated=None, mask=None,
                   gamma=0.99, lam=0.95, last_value=0.0, advantages=adv, returns=ret)
    with cb.override(raw_launch=True, rows_min_blocks=1):
        cb.gae(p)
    a = seen["args"]
    assert a[0] is r and a[1] is v and a[3] is d and a[10] is adv and a[11] is ret
    assert a[2] == ("dummy", "<f4", 2) and seen["ptr"] == 4242 and seen["dev"] == 0
    assert seen["kernel"][0] == "typed" and seen["grid"] == R and seen["block"] == (1, 256)


# --------------------------------------------------------------------------- launch plans


def test_plan_names_the_variants_that_apply():
    import numpy as np

    from gaescan.kernels import cuda as kern

    # Many long rows: a block per row walking its tiles (the row-resident driver).
    p = cb.plan(256, 131072, np.float32)
    assert (p["mode"], p["time_threads"], p["k"], p["tiles_per_row"], p["blocks"]) == ("rows", 256, 8, 64, 256)
    assert p["options"] == "-" and p["opts"] == 0
    assert cb.plan(256, 131072, np.float32, vector=True)["options"] == "vector_access"
    # Few long rows: tiles with the fast look-back (float32 only).
    p = cb.plan(4, 2**22, np.float32)
    assert (p["mode"], p["blocks"], p["options"]) == ("lookback", 4 * 2048, "fast_lookback")
    assert p["opts"] == kern.OPT_FASTLB
    assert cb.plan(4, 2**22, np.float64)["options"] == "-"
    assert cb.plan(8, 1024, np.float32)["mode"] == "rows"
    with cb.override(fast_lookback=False):
        assert cb.plan(4, 2**22, np.float32)["options"] == "-"
    with cb.override(prefetch=True):
        assert cb.plan(256, 131072, np.float32)["options"] == "prefetch"
        assert cb.plan(256, 1024, np.float32)["options"] == "-"  # one tile: nothing to prefetch
        assert cb.plan(4, 2**22, np.float32)["options"] == "fast_lookback"  # look-back: no prefetch
    assert cb.plan(7, 100, packed=True)["options"] == "packed"


def test_every_swept_setting_gets_the_variants_it_names():
    # gpu-check times each setting once on the GPU: a setting that turns a kernel
    # variant on or off where it does not apply would time another kernel than its
    # name says.
    gc = pytest.importorskip("gaescan.bench.gpu_check")

    n = 0
    for label, B, T, settings in gc.sweep_shapes():
        for st in settings:
            with cb.override(**st):
                got = set(cb.plan(B, T, vector=True)["options"].split("+")) - {"-"}
            for k in ("prefetch", "fast_lookback"):
                if k in st:
                    assert (k in got) == st[k], f"{label} {st}: the kernel gets {got or 'no variant'}"
            n += 1
    assert n == sum(len(s[3]) for s in gc.sweep_shapes()) > 20


@pytest.mark.parametrize("settings,match", [
    (dict(threads=48), "threads=48 is not a block size"),
    (dict(threads=100), "threads=100 is not a block size"),
    (dict(threads=2048), "threads=2048 is not a block size"),
    (dict(threads=0), "threads=0 must be a positive integer"),
    (dict(k=2.5), "k=2.5 must be a positive integer"),
    (dict(k=True), "k=True must be a positive integer"),
    (dict(k_time_major=0), "k_time_major=0 must be"),
    (dict(rows_time_major=12), "rows_time_major=12 must be a power of two"),
])
def test_tunables_the_kernels_cannot_take_are_refused(settings, match):
    # On a GPU nothing bounds-checks shared memory: a block with a partial warp after
    # full ones (threads=48) would leave steps unwritten and write past its tile.
    with cb.override(**settings), pytest.raises(ValueError, match=match):
        cb.plan(300, 100_000, time_major="time_major" in next(iter(settings)))


@pytest.mark.parametrize("threads", [1, 4, 16, 32, 96, 128, 1024])
def test_block_sizes_the_kernels_take(threads):
    with cb.override(threads=threads):
        p = cb.plan(3, 100_000)
    assert p["time_threads"] * p["rows_per_block"] <= threads


def test_a_tile_over_the_shared_memory_limit_names_the_tunables(monkeypatch):
    # ptxas refuses a block's static shared memory over 48 KiB ("too much shared
    # data", checked against ptxas in test_ptx): the call says which tunables to lower.
    import numpy as np

    def refuse(sig, **kw):
        raise RuntimeError("ptxas error   : Entry function 'k' uses too much shared data (0xdc20 bytes)")

    monkeypatch.setattr(cb.cuda, "jit", refuse)
    monkeypatch.setattr(cb, "_typed_cache", {})
    args = tuple(np.zeros((2, 2), np.float32) for _ in range(cb._N_ARRAYS)) + (np.float32(1), np.int64(2))
    with pytest.raises(ValueError, match="threads=512, k=8 needs more static shared memory.*lower threads"):
        cb._typed(_Kernel, (0, 1, False, "<f4", 512, 8, 0), args)
