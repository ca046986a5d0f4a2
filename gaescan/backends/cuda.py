"""The ``"cuda"`` backend: Numba CUDA kernels on CuPy arrays (or NumPy arrays in the simulator).

Every call is one kernel launch on the caller's current stream (CuPy's current
stream; the public API makes it PyTorch's when the inputs were tensors), plus,
for rows split across blocks, one stream-ordered ``cupy.zeros`` for the
look-back flags.  Nothing is read back to the host and no stream is
synchronised: arrays are handed to Numba as device-array views built from
their ``__cuda_array_interface__`` without the ``stream`` entry (so Numba
neither synchronises nor wraps it), cached by pointer and geometry.  Each
kernel is compiled once per dtype combination with every array typed as
layout ``"A"`` (contiguous and strided views share it).  Packed rows are
handled entirely on the device: ``cu_seqlens`` is only read by the kernel.

Geometry (see :mod:`gaescan.kernels.cuda`): a block is ``RW`` rows x ``TW``
time-threads, each thread ``K`` consecutive steps per tile.

* row-major rows: ``RW = 1`` and ``TW`` up to ``threads`` (short rows get a
  smaller ``TW`` and several rows per block);
* time-major rows (time stride larger than row stride, e.g. ``axis=0``):
  ``RW = 32`` consecutive rows per block, so a warp reads 32 consecutive
  addresses at each step — no transposing copy;
* a block per row group walking its tiles (``MODE_ROWS``) when the rows fill
  the GPU or fit one tile, else a block per tile with the ticketed look-back
  (``MODE_LOOKBACK``: few long rows, packed ``cu_seqlens``).

Tunables live in :data:`TUNABLES` and are read on every call; :func:`override`
changes them temporarily (tests shrink tiles so a few thousand steps cross
every tile, block and chunk boundary).  Test hooks, which make a call take
paths that production runs reach rarely, live apart in :data:`TEST_HOOKS`
(:func:`test_hooks`); neither changes a result.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from typing import Any

import numpy as np
from numba import cuda

try:
    from numba.cuda import types
except ImportError:  # pragma: no cover - an old Numba
    from numba import types

from .._config import Tunables
from .._problem import GAEProblem, ReturnsProblem, ScanProblem, widened
from ..kernels import cuda as kern
from ._cuda_graphs import keeping_if_captured

if not hasattr(types, "Array"):
    # Numba's built-in CUDA target (no numba-cuda): its numba.cuda.types holds only
    # the CUDA-specific types; the array type is Numba's own.
    from numba import types

TUNABLES: dict[str, Any] = {
    # Threads per block (also the shared-memory scan width; a compile-time constant):
    # a multiple of 32 up to 1024, or 1, 2, 4, 8 or 16.  The default is gpu-check's
    # fastest on an H200 for many long rows (row-resident driver) and time-major rows,
    # and within its noise of the fastest for few long rows (fast look-back):
    # benchmarks/results/*-nvidia-h200-sweep.txt.
    "threads": 256,
    # Steps per thread per tile for row-major rows (float32 / float64 outputs);
    # staged in registers, a compile-time constant of the kernel.
    "k": 8,
    "k_f64": 4,
    # Steps per thread per tile for time-major rows.
    "k_time_major": 8,
    # Rows per block for time-major rows (a power of two).
    "rows_time_major": 32,
    # Ask ptxas for registers that let this many blocks share an SM (CUDA launch
    # bounds; 0 = no bound, ptxas decides).  A bound may spill registers to local memory.
    "min_blocks_per_sm": 0,
    # Use a block per row group (walking tiles) when there are at least this many
    # row groups; else split rows into tiles with the look-back.  256 rows of one
    # block each fill an H200 (two resident blocks of 256 threads on each of 132 SMs),
    # where the row-resident driver beats both look-backs.
    "rows_min_blocks": 256,
    # The one candidate beside the row-resident default (gpu-check times both ways):
    # MODE_ROWS blocks issue the loads of their next tile before scanning this one,
    # so a block always has loads in flight (costs the registers of a second tile).
    "prefetch": False,
    # MODE_LOOKBACK with one row per block, float32 outputs and (alpha, c) maps (all
    # but masked GAE): flags and values share 64-bit words written atomically, so
    # publishing needs no memory fence, and one warp polls 32 tiles per round.  Off,
    # every look-back takes the general one (a flag word, a fence, a record).
    "fast_lookback": True,
    # Read each thread's steps and write the staged outputs with 16-byte accesses
    # (ld.global.nc.v4.f32 / st.global.v4.f32; v2.f64 for float64) where the layout
    # allows: see vector_ok.  The same bits as the element accesses.
    "vector_access": True,
    # Experimental (GPU, CuPy; gpu-check compares it): pack the kernel's parameters
    # into one buffer in Python and launch through the CUDA driver (cuLaunchKernel via
    # CuPy), skipping Numba's per-argument launch work and the device-array views.
    "raw_launch": False,
}

#: Hooks for tests and gpu-check, not settings: each makes calls take a path
#: that production calls reach rarely, with unchanged results.
TEST_HOOKS: dict[str, Any] = {
    # Most look-back tiles never publish their inclusive state, so later tiles
    # walk (and apply) long runs of published maps.
    "unpublished_tiles": False,
    # In the simulator, launch through the explicit-signature path used on GPUs.
    "typed_in_sim": False,
}

_lock = threading.Lock()
_tunables = Tunables(TUNABLES, label="CUDA tunable")
_hooks = Tunables(TEST_HOOKS, label="CUDA test hook")

#: Current value of a tunable (thread-local overrides first).
get = _tunables.get

#: Temporarily override tunables in the current thread
#: (``with override(k=2, threads=8): ...``).
override = _tunables.override

#: Temporarily set test hooks in the current thread
#: (``with test_hooks(unpublished_tiles=True): ...``).
test_hooks = _hooks.override
_hook = _hooks.get


def is_simulator() -> bool:
    """True when Numba's CUDA simulator runs the kernels (on NumPy arrays)."""
    return kern.SIMULATOR


def current_stream_ptr() -> int:
    """The stream a call launches on: CuPy's current stream (0 = the legacy default stream)."""
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


# ptxas's words for a block whose static shared memory is over the limit.
_SMEM_LIMIT = "too much shared data"


def _check_shared_memory(exc: Exception, threads: int, k: int) -> None:
    """Raise a ValueError naming the tunables if ``exc`` is ptxas refusing a tile's shared memory."""
    if _SMEM_LIMIT in str(exc):
        raise ValueError(
            f"the kernel for CUDA tunables threads={threads}, k={k} needs more static shared memory "
            "than a block may have (48 KiB): lower threads or k") from exc


# --------------------------------------------------------------------------- plumbing

_streams: dict[int, Any] = {}
_dummies: dict[tuple, Any] = {}


def _stream(ptr: int) -> Any:
    if ptr == 0:
        return 0
    s = _streams.get(ptr)
    if s is None:
        if len(_streams) > 64:
            _streams.clear()
        s = cuda.external_stream(ptr)
        _streams[ptr] = s
    return s


def _dummy(dev: int, dtype: Any, ndim: int) -> Any:
    """A never-read placeholder for an absent array argument (stable kernel types).

    ``dev`` is the CUDA device id, or -1 in the simulator (a NumPy placeholder).
    """
    key = (dev, dtype, ndim)
    d = _dummies.get(key)
    if d is None:
        shape = (1,) * ndim
        d = np.zeros(shape, dtype=dtype) if dev < 0 else cuda.device_array(shape, dtype=dtype)
        _dummies[key] = d
    return d


def _tunable_int(name: str) -> int:
    """A tunable that must be a positive integer, checked (it may have been set to anything)."""
    val = get(name)
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, np.integer)) or val < 1:
        raise ValueError(f"CUDA tunable {name}={val!r} must be a positive integer")
    return int(val)


def _pow2ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def vector_steps(dtype: Any, T: int, K: int) -> bool:
    """Whether rows of ``T`` steps, ``K`` per thread, allow ``OPT_VECTOR``'s 16-byte accesses.

    float32 or float64 data, and ``T`` and ``K`` multiples of the ``16 // itemsize``
    elements of one access: then every thread's steps, and every run of steps a
    warp stores, fall in whole 16-byte groups inside the row, read and written in
    both time directions (a forward scan's group ends where a reverse one starts).
    """
    dt = np.dtype(dtype)
    if dt != np.float32 and dt != np.float64:
        return False
    n = 16 // dt.itemsize
    return T % n == 0 and K % n == 0


def _layout(x: Any, host: bool = True) -> tuple[int, np.dtype, tuple, tuple] | None:
    """``(pointer, dtype, shape, strides in bytes)`` of an array, from attributes
    only (no device access): CuPy's attributes, else the CUDA array interface
    (torch tensors, Numba device arrays), else, with ``host``, the NumPy array
    interface (the simulator's arrays).  C-contiguous strides are filled in;
    ``None`` when the object exports none of them."""
    try:  # CuPy arrays: plain attribute reads
        return int(x.data.ptr), x.dtype, tuple(x.shape), tuple(x.strides)
    except AttributeError:
        pass
    try:
        ai = getattr(x, "__cuda_array_interface__", None)
        if ai is None and host:
            ai = getattr(x, "__array_interface__", None)
    except Exception:  # e.g. a tensor that refuses to export itself
        return None
    if ai is None:
        return None
    dt, shape = np.dtype(ai["typestr"]), tuple(ai["shape"])
    strides = ai.get("strides")
    if strides is None:
        strides, step = [], dt.itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return int(ai["data"][0]), dt, shape, tuple(strides)


def vector_ok(arrays: Any, dtype: Any) -> bool:
    """Whether ``OPT_VECTOR``'s 16-byte accesses are valid for these ``(R, T)`` arrays.

    Every array (``None``: absent, ignored) must hold ``dtype`` elements
    consecutively along time (time stride = itemsize), start at a multiple of
    16 bytes, and have a row stride that is one, so every row starts on a
    16-byte boundary.  Read from the array's pointer, shape and strides only:
    no device access and no synchronisation.  The backend also needs
    :func:`vector_steps`; an empty ``arrays`` is not valid.
    """
    dt = np.dtype(dtype)
    seen = False
    for x in arrays:
        if x is None:
            continue
        info = _layout(x)
        if info is None:
            return False
        ptr, xdt, shape, strides = info
        if np.dtype(xdt) != dt or len(shape) != 2:
            return False
        if (shape[1] > 1 and strides[1] != dt.itemsize) or (shape[0] > 1 and strides[0] % 16):
            return False
        if ptr % 16:
            return False
        seen = True
    return seen


class _Launch:
    """Per-call conversion of arrays and launch parameters."""

    def __init__(self, rows: Any, ref: Any) -> None:
        self.sim = is_simulator()
        # The arrays themselves go to the raw launch (their pointers, shapes and strides).
        self.raw = not self.sim and bool(get("raw_launch"))
        # Looked up once per call: the device of the placeholder arrays.
        self.dev = -1 if self.sim else cuda.get_current_device().id
        self.xp = rows.xp
        self.dtype = np.dtype(rows.dtype)
        self.cast = self.dtype.type
        self.R, self.T, self.nseg = int(rows.R), int(rows.T), int(rows.nseg)
        self.packed = rows.cu_seqlens is not None
        self.cu = rows.cu_seqlens
        st = ref.strides
        self.time_major = self.R > 1 and abs(st[1]) > abs(st[0]) and st[0] != 0

    def arr(self, x: Any, dtype: Any, ndim: int) -> Any:
        if x is None:
            return _dummy(self.dev, dtype, ndim)
        if self.sim:
            # Wrapped as a simulated device array: no copy in, no copy back
            # (inputs may be read-only broadcast views).
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            return FakeCUDAArray(x)
        if self.raw:
            return x
        return _device_view(x)

    def geometry(self) -> tuple[int, int, int, int, int]:
        threads = _tunable_int("threads")
        if threads > 1024 or (threads % 32 and threads & (threads - 1)):
            # The kernels map a row's time-threads onto whole warps (or one partial
            # warp): a partial warp after full ones would leave steps unwritten.
            raise ValueError(f"CUDA tunable threads={threads} is not a block size the kernels support: "
                             "use a multiple of 32 up to 1024 (or 1, 2, 4, 8 or 16)")
        R, T = self.R, self.T
        if self.time_major and not self.packed:
            K = _tunable_int("k_time_major")
            if self.dtype == np.float64:
                K = min(K, _tunable_int("k_f64"))
            rows_tm = _tunable_int("rows_time_major")
            if rows_tm & (rows_tm - 1):
                raise ValueError(f"CUDA tunable rows_time_major={rows_tm} must be a power of two "
                                 "(rows share warps evenly)")
            RW = min(rows_tm, _pow2ceil(R), threads)
            TW = max(1, threads // RW)
            TW = min(TW, _pow2ceil(-(-T // K)))
        else:
            K = _tunable_int("k_f64" if self.dtype == np.float64 else "k")
            TW = min(threads, _pow2ceil(-(-T // K)))
            RW = 1 if self.packed else min(max(1, threads // TW), _pow2ceil(R))
        tile = TW * K
        nchunks = -(-T // tile)
        ngroups = -(-R // RW)
        if nchunks == 1 or ngroups >= int(get("rows_min_blocks")):
            mode = kern.MODE_ROWS
        else:
            mode = kern.MODE_LOOKBACK
        return RW, TW, K, mode, nchunks

    def variant(self, kind: int, opts: int,
                vector: bool = False) -> tuple[int, int, int, int, int, int, bool]:
        """Geometry and option bits of this call's kernel: ``(RW, TW, K, mode, nchunks, opts, fast)``.

        ``vector``: the arrays' layout allows 16-byte accesses (:func:`vector_ok`);
        ``OPT_VECTOR`` is set where ``T`` and ``K`` allow them too.
        """
        RW, TW, K, mode, nchunks = self.geometry()
        if _hook("unpublished_tiles"):
            opts |= kern.OPT_UNPUBLISHED
        if mode == kern.MODE_ROWS and nchunks > 1 and get("prefetch"):
            opts |= kern.OPT_PREFETCH
        fast = (mode == kern.MODE_LOOKBACK and RW == 1 and self.dtype == np.float32
                and not (kind == kern.GAE_V and opts & kern.OPT_MASK) and get("fast_lookback"))
        if fast:
            opts |= kern.OPT_FASTLB
        if vector and vector_steps(self.dtype, self.T, K):
            opts |= kern.OPT_VECTOR
        return RW, TW, K, mode, nchunks, opts, fast

    def run(self, kind: int, fwd: bool, a: dict, g_s: float, l_s: float, lv_s: float, opts: int,
            vec: tuple = ()) -> None:
        """Launch the kernel; ``vec``: the arrays it would read and write with 16-byte accesses."""
        vector = bool(get("vector_access")) and vector_ok(vec, self.dtype)
        RW, TW, K, mode, nchunks, opts, fast = self.variant(kind, opts, vector)
        nsh = int(get("threads"))
        kernel = kern.get_kernel(kind, mode, fwd, self.dtype, nsh, K, opts)
        ngroups = -(-self.R // RW)
        dt = self.dtype
        pub, flg = _dummy(self.dev, dt, 1), _dummy(self.dev, np.int32, 1)
        lbw = _dummy(self.dev, np.uint64, 1)
        keep = ()
        ptr = 0 if self.sim else current_stream_ptr()
        grid = ngroups
        if mode == kern.MODE_LOOKBACK:
            xp = self.xp
            grid = ngroups * nchunks
            # Stream-ordered: the zero fill is queued on the current stream before the kernel.
            # The buffers stay referenced (``keep``) until the launch is queued; after
            # that, CuPy's pool only hands them out again in this stream's order.  A
            # graph capture keeps them (a replay reuses their addresses), and captures
            # the fill too, so each replay starts from zeroed tickets and flags.
            with contextlib.nullcontext() if self.sim else keeping_if_captured(ptr):
                if fast:
                    # The ticket counter, then 3 words per (tile, row): see kernels.cuda_lookback.fast_lookback.
                    keep = (xp.zeros(1 + 3 * nchunks * self.R, dtype=np.uint64),)
                    lbw = self.arr(keep[0], np.uint64, 1)
                else:
                    _, grec = kern.group_record(dt.itemsize, RW)
                    keep = (xp.empty(nchunks * ngroups * grec, dtype=dt),
                            xp.zeros(nchunks * self.R + 1, dtype=np.int32))
                    pub, flg = self.arr(keep[0], dt, 1), self.arr(keep[1], np.int32, 1)
        args = (
            a["r"], a["v"], a["nv"], a["term"], a["trunc"], a["mask"], a["g"], a["l"], a["lv"],
            a["cu"], a["out1"], a["out2"],
            self.cast(g_s), self.cast(l_s), self.cast(lv_s), np.int64(opts),
            np.int64(self.R), np.int64(self.T), np.int64(self.nseg),
            np.int64(RW), np.int64(TW), pub, flg, lbw,
        )
        key = (kind, mode, fwd, dt.str, nsh, K, opts & _CT)
        if not self.sim or _hook("typed_in_sim"):
            kernel = _typed(kernel, key, args, int(get("min_blocks_per_sm")))
        if self.sim:
            kernel[grid, (RW, TW)](*args)
            return
        try:
            if self.raw:
                _launch_raw(kernel, self.dev, args, grid, (RW, TW), ptr)
            else:
                kernel[grid, (RW, TW), _stream(ptr)](*args)
        except Exception as exc:
            _check_shared_memory(exc, nsh, K)
            raise


def _only_kernel(dispatcher: Any, tunable: str) -> Any:
    """The one compiled kernel of an explicit-signature dispatcher (for the launch paths)."""
    compiled = list(dispatcher.overloads.values())
    if len(compiled) != 1:
        raise RuntimeError(f"{tunable} needs a kernel compiled for exactly one signature, "
                           f"found {len(compiled)}; set the '{tunable}' tunable to False")
    return compiled[0]


class _RawKernel:
    """One compiled kernel's handle and its parameter buffer, for :func:`_launch_raw`."""

    __slots__ = ("handle", "fmt", "arrays", "buf", "size", "extra", "extra_ptr")

    def __init__(self, handle: int, argument_types: Any) -> None:
        self.handle = handle
        self.fmt = param_format(argument_types)
        self.arrays = tuple(isinstance(t, types.Array) for t in argument_types)
        self.size = ctypes.c_size_t(struct.calcsize(self.fmt))
        self.buf = ctypes.create_string_buffer(max(self.size.value, 1))
        # cuLaunchKernel's ``extra``: the parameters as one buffer of that size.
        self.extra = (ctypes.c_void_p * 5)(_CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self.buf),
                                           _CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self.size),
                                           _CU_LAUNCH_PARAM_END)
        self.extra_ptr = ctypes.addressof(self.extra)


_CU_LAUNCH_PARAM_END = 0
_CU_LAUNCH_PARAM_BUFFER_POINTER = 1
_CU_LAUNCH_PARAM_BUFFER_SIZE = 2
_SCALAR_CODES = {"int64": "q", "uint64": "Q", "int32": "i", "uint32": "I", "float32": "f", "float64": "d"}


def param_format(argument_types: Any) -> str:
    """The :mod:`struct` format (native alignment) of a Numba kernel's parameters.

    Numba passes an array as ``meminfo, parent, nitems, itemsize, data,
    shape..., strides...`` (pointer-sized each); scalars as themselves.  Packed
    with C alignment, as ``cuLaunchKernel`` reads a parameter buffer.
    """
    codes = []
    for t in argument_types:
        if isinstance(t, types.Array):
            codes.append("q" * (5 + 2 * t.ndim))
        else:
            code = _SCALAR_CODES.get(str(t))
            if code is None:
                raise TypeError(f"raw_launch: no parameter format for a {t} argument; "
                                "set the 'raw_launch' tunable to False")
            codes.append(code)
    return "@" + "".join(codes)


_flat_cache: dict[int, tuple] = {}


def flat_array(x: Any) -> tuple:
    """An array argument as Numba's kernel ABI passes it (see :func:`param_format`)."""
    # The never-read placeholders (Numba device arrays) live for the process, so
    # their ids are theirs: looked up first, they cost no failed attribute read.
    f = _flat_cache.get(id(x))
    if f is not None:
        return f
    try:  # CuPy arrays: plain attribute reads
        return (0, 0, x.size, x.itemsize, x.data.ptr) + tuple(x.shape) + tuple(x.strides)
    except AttributeError:
        pass
    # Numba device arrays and any other CUDA-array-interface object.
    info = _layout(x, host=False)
    if info is None:
        raise TypeError(f"a {type(x).__name__} is not a device array (no __cuda_array_interface__)")
    ptr, dt, shape, strides = info
    f = (0, 0, int(np.prod(shape, dtype=np.int64)), dt.itemsize, ptr) + shape + strides
    if any(x is d for d in _dummies.values()):
        _flat_cache[id(x)] = f
    return f


_raw_kernels: dict[tuple, _RawKernel] = {}
_raw_lock = threading.Lock()


def _launch_raw(dispatcher: Any, dev: int, args: tuple, grid: int, block: tuple[int, int], ptr: int) -> None:
    """Launch the single compiled kernel of an explicit-signature dispatcher through the driver.

    The same kernel, parameters, grid, block and stream as
    ``dispatcher[grid, block, stream](*args)``; the parameters are packed in
    one buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``), which the driver copies
    before ``cuLaunchKernel`` returns.
    """
    import cupy

    rk = _raw_kernels.get((dispatcher, dev))
    if rk is None:
        k = _only_kernel(dispatcher, "raw_launch")
        # A CUkernel (library API; cuLaunchKernel takes it for a CUfunction and launches
        # it in the current context) or a CUfunction (a ctypes handle in older Numbas).
        h = k._codelibrary.get_cufunc().handle
        h = h.value if isinstance(h, ctypes.c_void_p) else int(h)
        rk = _raw_kernels[(dispatcher, dev)] = _RawKernel(h, k.argument_types)
    vals: list = []
    for x, is_array in zip(args, rk.arrays, strict=True):
        if is_array:
            vals.extend(flat_array(x))
        else:
            vals.append(x)
    with _raw_lock:
        struct.pack_into(rk.fmt, rk.buf, 0, *vals)
        cupy.cuda.driver.launchKernel(rk.handle, grid, 1, 1, block[0], block[1], 1, 0, ptr, 0, rk.extra_ptr)


_typed_cache: dict[tuple, Any] = {}
_CT = kern.CT_BITS


# The launch arguments start with the 12 problem arrays (r .. out2): their dtypes are
# all a signature can vary in.  Every other argument's type is fixed by the key
# (ndims per position, scalars of the output dtype or int64, pub of the output dtype,
# flg int32, lbw uint64).
_N_ARRAYS = 12


def launch_bounds(threads: int, min_blocks: int) -> tuple[int, int] | None:
    """The launch bounds a kernel of ``threads`` per block is compiled with (see :func:`_typed`)."""
    if min_blocks > 0 or threads > 256:
        return threads, max(min_blocks, 1)
    return None


def _typed(kernel: Any, key: tuple, args: tuple, min_blocks: int = 0) -> Any:
    """A dispatcher compiled for ``args`` with every array typed as layout ``"A"``.

    Contiguous and strided views then share one compiled kernel (Numba would
    otherwise compile one specialisation per combination of layouts).  Should
    the explicit signature be refused, the lazily specialising kernel is used.
    ``min_blocks > 0`` compiles with launch bounds ``(threads, min_blocks)``
    (``threads`` = ``key[4]``, the largest block the kernel is launched with).
    Blocks of more than 256 threads always get launch bounds ``(threads, 1)``:
    unbounded, ptxas may use more registers than such a block can have (the
    prefetching kernel takes 166), and the launch would fail.
    """
    full = key + (min_blocks,) + tuple(x.dtype for x in args[:_N_ARRAYS])
    d = _typed_cache.get(full)
    if d is None:
        try:  # numba-cuda's own typeof (it knows device arrays and the CUDA array interface)
            from numba.cuda.typing.typeof import typeof
        except ImportError:  # pragma: no cover - older numba-cuda
            from numba import typeof

        with _lock:
            d = _typed_cache.get(full)
            if d is None:
                sig = []
                for x in args:
                    t = typeof(x)
                    if isinstance(t, types.Array):
                        t = t.copy(layout="A", readonly=False)
                    sig.append(t)
                bounds = launch_bounds(key[4], min_blocks)
                opts = {} if bounds is None else {"launch_bounds": bounds}
                try:
                    d = cuda.jit(types.void(*sig), **opts)(kernel.py_func)
                except Exception as exc:  # pragma: no cover - depends on the numba-cuda version
                    _check_shared_memory(exc, key[4], key[5])
                    import warnings

                    warnings.warn(f"gaescan: explicit-signature compile failed ({exc!r}); "
                                  "falling back to per-layout specialisation", RuntimeWarning, stacklevel=3)
                    d = kernel
                _typed_cache[full] = d
    return d


_views: dict[tuple, Any] = {}


def _device_view(x: Any) -> Any:
    """A Numba device-array view of a CuPy array, without synchronising any stream.

    Built from the array interface with the ``stream`` entry dropped (Numba
    would otherwise synchronise it, or at least wrap it) and no owner: the
    view is only used for the launch, while the caller's arrays are alive.
    Views are cached by (pointer, shape, strides, dtype): a recycled
    allocation with the same geometry yields an identical view.
    """
    cai = x.__cuda_array_interface__
    key = (cai["data"][0], cai["shape"], cai.get("strides"), cai["typestr"])
    d = _views.get(key)
    if d is None:
        desc = {k: val for k, val in cai.items() if k != "stream"}
        try:
            d = cuda.from_cuda_array_interface(desc, owner=None, sync=False)
        except Exception:  # pragma: no cover - older numba-cuda
            return cuda.as_cuda_array(x, sync=False)
        if len(_views) > 512:
            _views.clear()
        _views[key] = d
    return d


#: The compile-time option bits by the name of the tunable (or input) that sets them.
OPTION_NAMES = {kern.OPT_MASK: "mask", kern.OPT_PACKED: "packed", kern.OPT_PREFETCH: "prefetch",
                kern.OPT_FASTLB: "fast_lookback", kern.OPT_VECTOR: "vector_access"}


def plan(R: int, T: int, dtype: Any = np.float32, time_major: bool = False, packed: bool = False,
         vector: bool = False) -> dict:
    """The launch a GAE problem of this shape (with dones) gets with the current tunables (for reports).

    ``options`` names the kernel's compile-time variants that the tunables asked for
    and that apply here (a tunable that does not apply to the shape is not listed);
    ``opts`` holds their bits (:mod:`gaescan.kernels.cuda`'s ``OPT_*``), with the rest
    of what the kernel is built from: ``threads`` and ``min_blocks_per_sm``.
    ``vector``: the arrays allow 16-byte accesses (:func:`vector_ok`: C-contiguous
    and 16-byte aligned, as fresh CuPy and torch allocations are; never
    ``time_major`` ones); the kernel then gets ``OPT_VECTOR`` where ``T`` and ``K``
    allow it and the ``vector_access`` tunable is on.
    """
    from types import SimpleNamespace

    L = _Launch.__new__(_Launch)
    L.R, L.T, L.dtype, L.time_major, L.packed = int(R), int(T), np.dtype(dtype), bool(time_major), bool(packed)
    base = kern.OPT_TERM | (kern.OPT_PACKED if packed else 0)
    vector = bool(vector) and bool(get("vector_access")) and not L.time_major
    RW, TW, K, mode, nchunks, opts, _ = L.variant(kern.GAE_V, base, vector)
    ngroups = -(-L.R // RW)
    name = "rows" if mode == kern.MODE_ROWS else "lookback"
    ct = opts & _CT
    return vars(SimpleNamespace(
        mode=name, rows_per_block=RW, time_threads=TW, k=K, tiles_per_row=nchunks,
        blocks=ngroups * (nchunks if mode == kern.MODE_LOOKBACK else 1),
        options="+".join(n for b, n in OPTION_NAMES.items() if ct & b) or "-",
        opts=ct, threads=int(get("threads")),
        min_blocks_per_sm=int(get("min_blocks_per_sm"))))


def _coeff(L: _Launch, c: Any, bit: int) -> tuple[Any, float, int]:
    if isinstance(c, float):
        return L.arr(None, L.dtype, 2), c, 0
    return L.arr(c, None, 2), 0.0, bit


def _bound(L: _Launch, b: Any) -> tuple[Any, float, int]:
    if isinstance(b, float):
        return L.arr(None, L.dtype, 1), b, 0
    return L.arr(b, None, 1), 0.0, kern.OPT_LVARR


def _flag(L: _Launch, f: Any | None, bit: int) -> tuple[Any, int]:
    if f is None:
        return L.arr(None, np.bool_, 2), 0
    return L.arr(f, None, 2), bit


def _common(L: _Launch) -> tuple[Any, int]:
    if L.packed:
        return L.arr(L.cu, None, 1), kern.OPT_PACKED
    return L.arr(None, np.int64, 1), 0


# --------------------------------------------------------------------------- decays near 1

#: The largest scalar decay (``γλ``, ``γ``, ``|a|``) whose float32 problems run the float32
#: kernels.  Above it, and below 1, a float32 problem runs the float64 kernels on float64
#: copies of its inputs, and its outputs are rounded once into the caller's: the float32
#: state drifts past the contract's tolerance there on rows longer than the horizon
#: (docs/semantics.md, "Known differences between backends").  A decay of exactly 1 rounds
#: nowhere.  Coefficient arrays, whose values the host does not read, keep the float32 kernels.
F32_STATE_MAX_DECAY = float(np.float32(0.999))


def _near_one(p: Any, *factors: Any) -> bool:
    """Whether float32 problem ``p``'s decay, the product of the scalar ``factors``, lies in
    ``(F32_STATE_MAX_DECAY, 1)`` (``False`` where a factor is an array)."""
    if p.rows.dtype != np.float32 or not all(isinstance(f, float) for f in factors):
        return False
    decay = abs(float(np.prod(factors)))
    return F32_STATE_MAX_DECAY < decay < 1.0


def _in_float64(p: Any, outputs: tuple[str, ...], run: Any) -> None:
    """``run`` on a float64 copy of problem ``p`` (:func:`gaescan._problem.widened`, no
    host synchronisation); its outputs stored, rounded once, in ``p``'s."""
    wide = widened(p, outputs)
    temps = {o: p.rows.xp.empty(getattr(p, o).shape, dtype=np.float64) for o in outputs}
    for o, t in temps.items():
        setattr(wide, o, t)
    run(wide)
    for o in outputs:
        getattr(p, o)[...] = temps[o]


# --------------------------------------------------------------------------- the three problems


def gae(p: GAEProblem) -> None:
    """Write ``p.advantages`` and ``p.returns`` (see :class:`gaescan._problem.GAEProblem`)."""
    if _near_one(p, p.gamma, p.lam):
        return _in_float64(p, ("advantages", "returns"), gae)
    L = _Launch(p.rows, p.rewards)
    g, g_s, o1 = _coeff(L, p.gamma, kern.OPT_GARR)
    lm, l_s, o2 = _coeff(L, p.lam, kern.OPT_LARR)
    if isinstance(p.last_advantage, float) and p.last_advantage == 0:
        lv, lv_s, o3 = _bound(L, p.last_value)
    else:
        # One O(rows) array holds both boundary values (stream-ordered fills, no sync):
        # last_value at [s], last_advantage at [nseg + s].
        both = L.xp.empty(2 * L.nseg, dtype=L.dtype)
        both[: L.nseg] = p.last_value
        both[L.nseg:] = p.last_advantage
        lv, lv_s, o3 = L.arr(both, None, 1), 0.0, kern.OPT_LVARR | kern.OPT_LAARR
    term, o4 = _flag(L, p.terminated, kern.OPT_TERM)
    trunc, o5 = _flag(L, p.truncated, kern.OPT_TRUNC)
    mask, o6 = _flag(L, p.mask, kern.OPT_MASK)
    cu, o7 = _common(L)
    kind = kern.GAE_V if p.next_values is None else kern.GAE_NEXT
    a = dict(
        r=L.arr(p.rewards, None, 2), v=L.arr(p.values, None, 2),
        nv=L.arr(p.next_values, L.dtype, 2), term=term, trunc=trunc, mask=mask,
        g=g, l=lm, lv=lv, cu=cu, out1=L.arr(p.advantages, None, 2), out2=L.arr(p.returns, None, 2),
    )
    L.run(kind, False, a, g_s, l_s, lv_s, o1 | o2 | o3 | o4 | o5 | o6 | o7,
          (p.rewards, p.values, p.next_values, p.advantages, p.returns))


def discounted_returns(p: ReturnsProblem) -> None:
    """Write ``p.returns`` (see :class:`gaescan._problem.ReturnsProblem`)."""
    if _near_one(p, p.gamma):
        return _in_float64(p, ("returns",), discounted_returns)
    L = _Launch(p.rows, p.rewards)
    g, g_s, o1 = _coeff(L, p.gamma, kern.OPT_GARR)
    lv, lv_s, o3 = _bound(L, p.last_value)
    term, o4 = _flag(L, p.dones, kern.OPT_TERM)
    mask, o6 = _flag(L, p.mask, kern.OPT_MASK)
    cu, o7 = _common(L)
    a = dict(
        r=L.arr(p.rewards, None, 2), v=L.arr(None, L.dtype, 2), nv=L.arr(None, L.dtype, 2),
        term=term, trunc=L.arr(None, np.bool_, 2), mask=mask, g=g, l=L.arr(None, L.dtype, 2),
        lv=lv, cu=cu, out1=L.arr(p.returns, None, 2), out2=L.arr(None, L.dtype, 2),
    )
    L.run(kern.RET, False, a, g_s, 0.0, lv_s, o1 | o3 | o4 | o6 | o7, (p.rewards, p.returns))


def linear_scan(p: ScanProblem) -> None:
    """Write ``p.out`` (see :class:`gaescan._problem.ScanProblem`)."""
    if _near_one(p, p.a):
        return _in_float64(p, ("out",), linear_scan)
    L = _Launch(p.rows, p.b)
    g, g_s, o1 = _coeff(L, p.a, kern.OPT_GARR)
    lv, lv_s, o3 = _bound(L, p.initial)
    d2 = L.arr(None, L.dtype, 2)
    fb = L.arr(None, np.bool_, 2)
    a = dict(
        r=L.arr(p.b, None, 2), v=d2, nv=d2, term=fb, trunc=fb, mask=fb, g=g, l=d2,
        lv=lv, cu=L.arr(None, np.int64, 1), out1=L.arr(p.out, None, 2), out2=d2,
    )
    L.run(kern.SCAN, not p.reverse, a, g_s, 0.0, lv_s, o1 | o3, (p.b, p.out))
