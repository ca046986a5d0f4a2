"""Numba CPU kernels over ``(R, T)`` rows.

Every kernel has one explicit signature per output dtype (float32, float64).
A kernel compiles (or loads from Numba's on-disk cache, ``cache=True``) the
signature a call needs on that first call, not at import: see :class:`Kernel`.
Arguments never trigger a new specialisation.  The general kernels take the
same argument kinds:

* data and coefficients are 2-D arrays of the output dtype with any strides
  (a scalar or per-row coefficient arrives as a zero-stride view);
* flags are 2-D uint8 arrays, nonzero = true (a free view of bool / 1-byte
  integer flags; an absent flag is a zero-stride view of 0, an absent mask
  one of 1);
* ``bound`` holds one boundary value per sequence (``last_value`` or
  ``initial``), ``carry`` the GAE advantage past each sequence's end
  (``last_advantage``); ``cu`` the packed offsets, read when ``packed`` is true;
* ``zero`` is 0 of the output dtype (what masked positions store).

The recurrence state (the carried advantage, return or ``y``) and its decay
(γλ, γ or ``a``) are float64 in every kernel's default build: float32 inputs
are widened where they meet the state, and outputs are rounded to float32 on
store.  With γ just
below 1 a float32 state rounds ``γ·acc`` the same way at every step and drifts
over long rows; a float64 state does not, and it adds no memory traffic.  The
GAE kernels compute each step's δ in the data dtype (one rounding per step,
which does not accumulate).  For float64 data every widening is the identity,
so float64 results are bit for bit those of a float64 loop.

Each float32 kernel also has a float32-state build (:meth:`Kernel.f32_state`):
the same code with ``_f8`` bound to float32, so that state and decay stay in
float32, as in a textbook float32 loop.  It runs fewer instructions per step
(no widening or rounding conversions).  Its state drift grows with the
horizon ``1/(1 − decay)``, so the backend uses it only where every decay is
known to be far from 1 (see :mod:`gaescan.backends.numba_cpu`).

The general kernels below run sequences in parallel (``prange``), two
sequences per loop (two independent chains hide each other's latency): rows
``2u`` and ``2u + 1``, or segments ``2u`` and ``2u + 1`` of a packed row.
They serve every feature combination.

Memory order.  The batch-major kernels scan each row (or segment) from its
end, with no software prefetches.  A build with software prefetches that
request each row's memory in ascending address order, measured on Intel Xeon
and AMD EPYC machines, is not faster (figures in ``benchmarks/results/``, see
``docs/performance.md``).  Forward scans stream memory upwards; the
time-major kernels read each step's block of batch columns upwards.

The fast paths at the end of the module (:func:`gae_rows_fused`,
:func:`gae_lanes`, :func:`gae_timemajor`) serve GAE plain, with terminations, with a mask, or
with ``next_values`` and both flags, with per-row/scalar γ, λ (the common RL
cases): fused (δ computed on the fly, each output written once, no
temporaries), rows in pairs on batch-major buffers, float32 rows eight at a
time in SIMD lanes where they are contiguous along time
(:mod:`gaescan.kernels._lanes` writes those vectors: LLVM does not vectorise
a chain across rows by itself), vectorised across the batch on time-major
buffers.  Batch-major float32 ``linear_scan`` and discounted returns run
eight rows in SIMD lanes likewise (:func:`scan_lanes`, :func:`returns_lanes`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any

import numpy as np
from numba import njit, prange, types
from numba.core.caching import NullCache

from .. import _threading
from ._lanes import fma, lanes_block, scan_block, sfence

_FLOATS = (types.float32, types.float64)
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_F4 = np.dtype(np.float32)
_f8 = np.float64

# One lock for all compilation: a kernel compiles each signature once, even
# when threads make their first calls at the same time.
_COMPILE_LOCK = threading.RLock()

#: Every lazily compiled kernel, in definition order (see :func:`all_kernels`):
#: this module's and those of the sibling modules in ``_SIBLINGS``.
_REGISTRY: list[Kernel] = []
#: The other CPU kernel modules (statistics, V-trace, turn-level GAE).  Their
#: kernels register here as well, so that :func:`compile_all` (``gaescan
#: warmup``) builds them too; importing them compiles nothing.
_SIBLINGS = ("cpu_stats", "cpu_vtrace", "cpu_turn")


class Kernel:
    """A Numba kernel compiled on first use, one explicit signature per dtype.

    Calling the kernel picks the signature by the dtype of its last argument
    (the output array) and, on the first call with that dtype, builds
    ``numba.njit(signature, cache=True, **options)`` for that signature only:
    the dispatcher is closed to other argument types, so a call never compiles
    a new specialisation, and Numba's disk cache makes later processes load it
    instead of compiling.  A parallel kernel also has a serial build of the
    same function (``prange`` runs as ``range``, same results bit for bit),
    used where the threading layer must not be entered from the calling
    thread (see :mod:`gaescan._threading`).

    Parameters
    ----------
    func : callable
        The Python function of the kernel.
    signatures : list of numba signatures
        One per entry of ``_DTYPES`` (float32, float64), in that order; ``None``
        for a dtype the kernel does not take.
    narrow : bool
        Whether the kernel has a float32-state build (see :meth:`f32_state`).
    **options
        Options for :func:`numba.njit` (``parallel``, ``fastmath``, ...).
    """

    def __init__(self, func: Callable[..., Any], signatures: list[Any], *, narrow: bool = False,
                 **options: Any):
        self.py_func = func
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__doc__ = func.__doc__
        self.__wrapped__ = func
        # ``None`` for a dtype the kernel does not take (a float32-only kernel).
        self.signatures = {dt: sig for dt, sig in zip(_DTYPES, signatures, strict=True) if sig is not None}
        self.parallel = bool(options.get("parallel", False))
        self._options = {**options, "cache": True, "nogil": True}
        self.narrow = bool(narrow)
        self._builds: dict[tuple[np.dtype, bool], Any] = {}
        # float32-state builds, keyed on ``serial``
        self._narrow_builds: dict[bool, Any] = {}
        _REGISTRY.append(self)

    def _serial(self) -> bool:
        if not self.parallel:
            return False
        if _threading.layer() is None:
            # before any parallel build runs: the layer decides serial_here()
            _threading.configure()
        return _threading.serial_here()

    def __call__(self, *args: Any) -> Any:
        serial = self._serial()
        try:
            build = self._builds[args[-1].dtype, serial]
        except KeyError:
            build = self.compile(args[-1].dtype, serial)
        return build(*args)

    def f32_state(self, *args: Any) -> Any:
        """Call the kernel, carrying a float32 output's state in float32.

        For a float32 output this runs the float32-state build (state and
        decay in float32: fewer instructions per step, but a state drift that
        grows with the horizon ``1/(1 − decay)``); for a float64 output, or a
        kernel without such a build, it is the plain call.
        """
        if not self.narrow or args[-1].dtype != _F4:
            return self(*args)
        serial = self._serial()
        build = self._narrow_builds.get(serial)
        if build is None:
            build = self.compile(_F4, serial, narrow=True)
        return build(*args)

    def caller(self, dtype: Any, narrow: bool = False) -> Callable[..., Any]:
        """The callable a call site may keep for ``dtype`` (and ``narrow``): the
        compiled build itself for a serial kernel (its choice of build never
        changes), else :meth:`__call__` or :meth:`f32_state`, which choose per
        call (the serial build of a parallel kernel depends on the thread)."""
        narrow = narrow and self.narrow and np.dtype(dtype) == _F4
        if self.parallel:
            return self.f32_state if narrow else self
        return self.compile(dtype, False, narrow)

    def compile(self, dtype: Any, serial: bool = False, narrow: bool = False) -> Any:
        """Compile (or load from the disk cache) the build for ``dtype``.

        Parameters
        ----------
        dtype : numpy dtype
            float32 or float64, the output dtype.
        serial : bool
            The serial build of a parallel kernel.
        narrow : bool
            The float32-state build (float32 only, see :meth:`f32_state`).

        Returns
        -------
        numba dispatcher
            The compiled dispatcher, closed to other signatures.
        """
        dt = np.dtype(dtype)
        if dt not in self.signatures:
            takes = " or ".join(str(d) for d in self.signatures)
            raise TypeError(f"{self.__name__}: no kernel for dtype {dt}; this kernel takes {takes}")
        if narrow and (dt != _F4 or not self.narrow):
            raise TypeError(f"{self.__name__}: no float32-state build for dtype {dt}")
        serial = serial and self.parallel
        table: dict[Any, Any] = self._narrow_builds if narrow else self._builds
        key: Any = serial if narrow else (dt, serial)
        with _COMPILE_LOCK:
            build = table.get(key)
            if build is None:
                options = dict(self._options)
                func = self.py_func
                suffix = ""
                namespace = func.__globals__
                if narrow:
                    suffix += "_f4"
                    namespace = _f4_namespace()
                if serial:
                    options["parallel"] = False
                    suffix += "_serial"
                elif self.parallel:
                    _threading.configure()
                if suffix:
                    func = _renamed(func, suffix, namespace)
                build = njit(self.signatures[dt], **options)(func)
                table[key] = build
        return build

    def compiled(self, dtype: Any, serial: bool = False, narrow: bool = False) -> bool:
        """Whether the build for ``dtype`` exists in this process."""
        serial = serial and self.parallel
        if narrow:
            return np.dtype(dtype) == _F4 and serial in self._narrow_builds
        return (np.dtype(dtype), serial) in self._builds


def _renamed(func: Callable[..., Any], suffix: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """``func`` under another qualified name, resolving globals in ``namespace``.

    Numba's disk cache keys an entry on the function's name, code and
    signature, not on ``parallel`` nor on the values of globals: the serial
    and float32-state builds need names of their own, or one would load
    another's machine code.
    """
    copy = FunctionType(func.__code__, namespace, func.__name__ + suffix, func.__defaults__,
                        func.__closure__)
    copy.__qualname__ = func.__qualname__ + suffix
    copy.__module__ = func.__module__
    copy.__doc__ = func.__doc__
    return copy


# The njit helpers that touch the recurrence state.  The float32-state builds
# resolve their globals in a copy of this module's namespace where ``_f8`` is
# float32 and each of these helpers is a copy compiled against that namespace.
_STATE_HELPERS = ("_gae_at", "_ret_at", "_scan_at", "_gstep", "_mstep", "_nstep", "_lane_steps",
                  "_rows_block", "_packed_block", "_tm_cols", "_tm_ret_at",
                  "_gae_span", "_gae_span2", "_ret_span", "_ret_span2",
                  "_row_next", "_row_mask", "_row_term", "_row_plain", "_seq_step", "_seq_pair", "_gae_row_uncarried",
                  "_gae_pair", "_gae_rows_apart", "_gae_unit", "_ret_pair", "_ret_unit", "_ret_tail", "_scan_steps")
_F4_NAMESPACE: dict[str, Any] = {}


def _f4_namespace() -> dict[str, Any]:
    with _COMPILE_LOCK:
        if not _F4_NAMESPACE:
            namespace = dict(globals())
            namespace["_f8"] = np.float32
            for name in _STATE_HELPERS:
                helper = globals()[name]
                options = {k: v for k, v in helper.targetoptions.items() if k != "nopython"}
                if not isinstance(helper._cache, NullCache):
                    options["cache"] = True
                namespace[name] = njit(**options)(_renamed(helper.py_func, "_f4", namespace))
            namespace.update(_LANES_F4)
            for case in ("term", "plain", "next"):
                namespace[f"_tmlanes_{case}"] = _TM_LANES[case, False]
            _F4_NAMESPACE.update(namespace)
    return _F4_NAMESPACE


def kernel(signatures: list[Any], *, narrow: bool = True, **options: Any) -> Callable[[Callable[..., Any]], Kernel]:
    """Decorator: a :class:`Kernel` with these signatures and njit options,
    and a float32-state build unless ``narrow`` is false (a float64-only kernel)."""
    return lambda func: Kernel(func, signatures, narrow=narrow, **options)


def all_kernels() -> list[Kernel]:
    """Every lazily compiled CPU kernel: this module's and its siblings'.

    A sibling module may make kernels on demand (one per argument layout, say);
    its ``declare_all()``, when it has one, makes every one of them (which
    compiles nothing) so that the list is complete.
    """
    for name in _SIBLINGS:
        module = importlib.import_module(f"{__package__}.{name}")
        declare = getattr(module, "declare_all", None)
        if declare is not None:
            declare()
    return list(_REGISTRY)


def builds() -> Iterator[tuple[Kernel, np.dtype, bool, bool]]:
    """Every ``(kernel, dtype, serial, narrow)`` build that :func:`compile_all`
    makes: both dtypes of every kernel, the serial build of each parallel one,
    and the float32-state builds (``narrow``) of float32."""
    for k in all_kernels():
        for dt in k.signatures:
            for narrow in (False, True) if k.narrow and dt == _F4 else (False,):
                yield k, dt, False, narrow
                if k.parallel:
                    yield k, dt, True, narrow


def compile_all(progress: Callable[[int, int, str], None] | None = None) -> int:
    """Compile (or load from the disk cache) every build of every kernel.

    Parameters
    ----------
    progress : callable, optional
        Called as ``progress(done, total, name)`` after each build.

    Returns
    -------
    int
        The number of builds.
    """
    todo = list(builds())
    for n, (k, dt, serial, narrow) in enumerate(todo, 1):
        k.compile(dt, serial, narrow)
        if progress is not None:
            tags = (" f32-state" if narrow else "") + (" serial" if serial else "")
            progress(n, len(todo), f"{k.__name__}[{dt}{tags}]")
    return len(todo)


def _ro(dtype: types.Type, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "A", readonly=True)


def _sigs(build):
    return [build(ft, _ro(ft, 2), _ro(types.uint8, 2), types.Array(ft, 2, "A")) for ft in _FLOATS]


_CU = _ro(types.int64, 1)


@njit(inline="always")
def _gae_at(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
            i, j, a_next, v_next, zero, adv, ret):
    """One general GAE step at ``[i, j]``; returns the carried ``(A, V)``."""
    if not mask[i, j]:
        adv[i, j] = zero
        ret[i, j] = zero
        return a_next, v_next
    g = gamma[i, j]
    vt = values[i, j]
    # Selects, not multiplications by (1 - flag): a NaN beyond an episode end
    # must not leak into it.
    # The flags and ``next_values`` (``values`` when not ``has_next``) are
    # read before the branches, not behind them (see _flag_at).
    tm = term[i, j] != 0
    dn = tm | (trunc[i, j] != 0)
    nvt = next_values[i, j]
    if tm:
        delta = rewards[i, j] - vt
    else:
        vn = nvt if has_next else v_next
        delta = rewards[i, j] + g * vn - vt
    # A zero decay γλ drops the carry as a done does (a select): the steps
    # before it do not depend on the steps after it (docs/semantics.md).
    gl = _f8(g) * _f8(lam[i, j])
    if dn or gl == 0:
        a = _f8(delta)
    else:
        a = _f8(delta) + gl * a_next
    a_out = adv.dtype.type(a)
    adv[i, j] = a_out
    ret[i, j] = a_out + vt
    return a, vt


@njit(inline="always")
def _ret_at(rewards, gamma, dones, mask, i, j, G, zero, out):
    """One discounted-returns step at ``[i, j]``; returns the carried ``G``."""
    if not mask[i, j]:
        out[i, j] = zero
        return G
    g = gamma[i, j]
    if dones[i, j] or g == 0:  # a zero γ drops the carry, as a done does
        G = _f8(rewards[i, j])
    else:
        G = _f8(rewards[i, j]) + _f8(g) * G
    out[i, j] = G
    return G


@njit(inline="always")
def _scan_at(a, b, i, j, y, out):
    at = a[i, j]
    y = _f8(b[i, j]) if at == 0 else _f8(at) * y + _f8(b[i, j])
    out[i, j] = y
    return y


# Steps by which the second sequence of a pair trails the first in the
# kernels that stagger their pairs (see :func:`scan_rows`): 64 steps are
# 256 bytes of float32, four cache sets.
PAIR_LAG = 64

# Sequences run in pairs (two independent chains in one loop hide each
# other's latency, see _gae_pair below): rows 2u and 2u + 1, or segments 2u
# and 2u + 1 of a packed row.  Both sequences run their first ``min(n0, n1)``
# steps in the pair's loop; the rest of the longer one runs alone.  A step
# ``j`` of a sequence ending before ``e`` is at position ``e - 1 - j``.


@njit(inline="always")
def _gae_span(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
              i, e, j0, j1, a, v, zero, adv, ret):
    for j in range(j0, j1):
        a, v = _gae_at(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                       i, np.uint64(e - 1 - j), a, v, zero, adv, ret)
    return a, v


@njit(inline="always")
def _gae_span2(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
               i0, e0, i1, e1, j1, a0, v0, a1, v1, zero, adv, ret):
    for j in range(j1):
        a0, v0 = _gae_at(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                         i0, np.uint64(e0 - 1 - j), a0, v0, zero, adv, ret)
        a1, v1 = _gae_at(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                         i1, np.uint64(e1 - 1 - j), a1, v1, zero, adv, ret)
    return a0, v0, a1, v1


@njit(inline="always")
def _pair(u, n, T, cu, packed):
    """Sequences ``2u`` and ``2u + 1``: ``(two, i0, e0, b0, i1, e1, b1)``, the
    row, end and start of each (``b1 = e1`` when ``2u`` is the last one)."""
    s0 = 2 * np.int64(u)
    s1 = s0 + 1
    two = s1 < n
    z = np.int64(0)
    if packed:
        e0 = cu[s0 + 1]
        e1 = cu[s1 + 1] if two else e0
        return two, z, e0, cu[s0], z, e1, cu[s1] if two else e1
    T = np.int64(T)
    return two, s0, T, z, s1 if two else s0, T, z if two else T


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, data, data, data, flag, flag, flag,
        types.boolean, _ro(ft, 1), _ro(ft, 1), _CU, types.boolean, ft, out, out)),
    parallel=True,
)
def gae_rows(rewards, values, next_values, gamma, lam, term, trunc, mask,
             has_next, bound, carry, cu, packed, zero, adv, ret):
    """``A_t = δ_t + γλ(1−done_t) A_{τ(t)}``, ``R_t = A_t + V_t`` per sequence.

    ``V'_t`` is ``next_values[r, t]`` when ``has_next``, else the value at the
    next unmasked position, else ``bound[s]`` (``last_value``); ``A`` past the
    end is ``carry[s]`` (``last_advantage``).
    """
    n = bound.shape[0]
    for u in prange((n + 1) // 2):
        two, i0, e0, b0, i1, e1, b1 = _pair(u, n, rewards.shape[1], cu, packed)
        s0 = 2 * np.int64(u)
        s1 = s0 + 1 if two else s0
        a0 = _f8(carry[s0])
        v0 = bound[s0]
        a1 = _f8(carry[s1])
        v1 = bound[s1]
        n0 = e0 - b0
        n1 = e1 - b1
        m = min(n0, n1)
        if m > 0:
            a0, v0, a1, v1 = _gae_span2(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                                        i0, e0, i1, e1, m, a0, v0, a1, v1, zero, adv, ret)
        if n0 > m:
            _gae_span(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                      i0, e0, m, n0, a0, v0, zero, adv, ret)
        elif n1 > m:
            _gae_span(rewards, values, next_values, gamma, lam, term, trunc, mask, has_next,
                      i1, e1, m, n1, a1, v1, zero, adv, ret)


@njit(inline="always")
def _ret_span(rewards, gamma, dones, mask, i, e, j0, j1, G, zero, out):
    for j in range(j0, j1):
        G = _ret_at(rewards, gamma, dones, mask, i, np.uint64(e - 1 - j), G, zero, out)
    return G


@njit(inline="always")
def _ret_span2(rewards, gamma, dones, mask, i0, e0, i1, e1, j1, G0, G1, zero, out):
    for j in range(j1):
        G0 = _ret_at(rewards, gamma, dones, mask, i0, np.uint64(e0 - 1 - j), G0, zero, out)
        G1 = _ret_at(rewards, gamma, dones, mask, i1, np.uint64(e1 - 1 - j), G1, zero, out)
    return G0, G1


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, flag, flag, _ro(ft, 1), _CU, types.boolean, ft, out)),
    parallel=True,
)
def returns_rows(rewards, gamma, dones, mask, bound, cu, packed, zero, out):
    """``G_t = r_t + γ(1−done_t) G_{τ(t)}``, ``G`` past the end = ``bound[s]``."""
    n = bound.shape[0]
    for u in prange((n + 1) // 2):
        two, i0, e0, b0, i1, e1, b1 = _pair(u, n, rewards.shape[1], cu, packed)
        s0 = 2 * np.int64(u)
        G0 = _f8(bound[s0])
        G1 = _f8(bound[s0 + 1 if two else s0])
        n0 = e0 - b0
        n1 = e1 - b1
        m = min(n0, n1)
        if m > 0:
            G0, G1 = _ret_span2(rewards, gamma, dones, mask, i0, e0, i1, e1, m, G0, G1, zero, out)
        if n0 > m:
            _ret_span(rewards, gamma, dones, mask, i0, e0, m, n0, G0, zero, out)
        elif n1 > m:
            _ret_span(rewards, gamma, dones, mask, i1, e1, m, n1, G1, zero, out)


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(data, data, types.boolean, _ro(ft, 1), out)),
    parallel=True,
)
def scan_rows(a, b, reverse, initial, out):
    """``y_t = a_t y_{t∓1} + b_t`` per row, starting from ``initial[r]``.

    Rows run in pairs, the second :data:`PAIR_LAG` steps behind the first
    (each chain's steps in their own order, so the bits of two chains side by
    side): the rows of a power-of-two length lie a multiple of 4 KiB apart,
    so the same step of two rows falls in one cache set, and a pair's six
    streams in one set evict each other's prefetched lines."""
    R, T = b.shape
    # Step j of a row is at o + s·j: from the end with ``reverse``.
    o, s = (np.int64(T) - 1, np.int64(-1)) if reverse else (np.int64(0), np.int64(1))
    for u in prange((R + 1) // 2):
        i = 2 * np.int64(u)
        k = i + 1
        y0 = _f8(initial[i])
        if k < R:
            y1 = _f8(initial[k])
            L = min(PAIR_LAG, T)
            for j in range(L):
                y0 = _scan_at(a, b, i, np.uint64(o + s * j), y0, out)
            for j in range(L, T):
                y0 = _scan_at(a, b, i, np.uint64(o + s * j), y0, out)
                y1 = _scan_at(a, b, k, np.uint64(o + s * (j - L)), y1, out)
            for j in range(T - L, T):
                y1 = _scan_at(a, b, k, np.uint64(o + s * j), y1, out)
        else:
            for j in range(T):
                y0 = _scan_at(a, b, i, np.uint64(o + s * j), y0, out)


# ------------------------------------------------------------ time-major, general
#
# The same problems on the transposes of time-major row views, ``(T, R)``
# arrays whose batch axis is the contiguous one: the scan runs over ``t`` and
# each step sweeps a block of batch columns, so memory is read in order and
# the columns' chains are independent (the per-row kernels above would walk
# every row with a stride of the batch size, touching a new cache line per
# step).  Each block keeps its columns' carries in arrays of its width: O(R)
# scratch in all.  Same operations per element as the per-row kernels.

_WG = 512  # batch columns per block


@njit(inline="always")
def _blocks(R):
    wb = _WG if R >= 4 * _WG else max(32, (R + 3) // 4)
    return wb, (R + wb - 1) // wb


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, data, data, data, flag, flag, flag,
        types.boolean, _ro(ft, 1), _ro(ft, 1), ft, out, out)),
    parallel=True,
)
def gae_tm(rewards, values, next_values, gamma, lam, term, trunc, mask,
           has_next, bound, carry, zero, adv, ret):
    """:func:`gae_rows` on ``(T, R)`` transposed views (no packing)."""
    T, R = rewards.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        an = np.empty(w, _f8)
        vn = np.empty(w, adv.dtype)
        for k in range(w):
            an[k] = carry[c0 + k]
            vn[k] = bound[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for k in range(w):
                an[k], vn[k] = _gae_at(rewards, values, next_values, gamma, lam, term, trunc, mask,
                                       has_next, t, np.uint64(c0 + k), an[k], vn[k], zero, adv, ret)


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(data, data, flag, flag, _ro(ft, 1), ft, out)),
    parallel=True,
)
def returns_tm(rewards, gamma, dones, mask, bound, zero, out):
    """:func:`returns_rows` on ``(T, R)`` transposed views (no packing)."""
    T, R = rewards.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        G = np.empty(w, _f8)
        for k in range(w):
            G[k] = bound[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for k in range(w):
                G[k] = _ret_at(rewards, gamma, dones, mask, t, np.uint64(c0 + k), G[k], zero, out)


@kernel(
    _sigs(lambda ft, data, flag, out: types.void(data, data, types.boolean, _ro(ft, 1), out)),
    parallel=True,
)
def scan_tm(a, b, reverse, initial, out):
    """:func:`scan_rows` on ``(T, R)`` transposed views."""
    T, R = b.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        y = np.empty(w, _f8)
        for k in range(w):
            y[k] = initial[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j) if reverse else np.uint64(j)
            for k in range(w):
                y[k] = _scan_at(a, b, t, np.uint64(c0 + k), y[k], out)


# --------------------------------------------------------------------------- fast paths
#
# Indices in the hot loops are uint64: Numba then emits no negative-index
# wraparound code.  ``fastmath={"contract"}`` allows FMA contraction only (no
# reassociation), so results stay bit-identical run after run and do not
# depend on the thread count (rows are independent; no chunking by threads).

_W = 1024            # batch columns per block on the time-major path
_FM = {"contract"}

_U8A = types.Array(types.uint8, 2, "A", readonly=True)
_U8C = types.Array(types.uint8, 2, "C", readonly=True)


def _c2(ft, ro=True):
    return types.Array(ft, 2, "C", readonly=ro)


@njit(inline="always")
def _flag_at(flags, has, i, t):
    """``has and flags[i, t] != 0`` with the read outside any branch.

    A short-circuit ``and`` or ``or`` puts an array read in a basic block of
    its own, around which Numba can leave the array's reference counting (an
    increment and a decrement, atomic calls into its runtime) inside the
    loop, at every step; in the pair kernels' step loops those calls cost
    most of the loop's speed (``tests/test_kernel_refcounts.py`` checks the
    IR).  Without ``has`` the read is at ``[0, 0]`` (``flags`` may be a
    ``(1, 1)`` placeholder) and its value discarded."""
    j = i if has else i - i
    u = t if has else t - t
    return has & (flags[j, u] != 0)


@njit(inline="always", fastmath=_FM)
def _gstep(rt, vt, vn, dt, g, gl, an):
    # δ in the data dtype, the carried A (``an``, ``gl``) in ``_f8``.  A
    # select, not a multiplication by (1 - done): NaN isolation.  Both
    # products fused by fma(), as the SIMD blocks fuse them.
    x = fma(gl, an, _f8(fma(g, vn, rt) - vt))
    y = _f8(rt - vt)
    return y if dt else x


@njit(inline="always", fastmath=_FM)
def _mstep(rt, vt, term, valid, g, gl, an, vn, zero):
    """A masked step: at a valid position the step of :func:`_gstep`; at a
    masked one the carried (A, V) pass through and both outputs are 0.  All
    selects: a NaN at a masked position is computed but never chosen.
    Returns the carried (A, V) and the A and V of the outputs (``ret = A + V``)."""
    x = fma(gl, an, _f8(fma(g, vn, rt) - vt))
    a = _f8(rt - vt) if term else x
    if valid:
        return a, vt, a, vt
    return an, vn, _f8(0.0), zero


@njit(inline="always", fastmath=_FM)
def _nstep(rt, vt, nvt, term, done, g, gl, an):
    """A step with ``V' = next_values[t]`` and truncation: the bootstrap is
    cut on ``term``, the sum on ``done = term or trunc`` (both selects)."""
    x = fma(g, nvt, rt) - vt
    y = rt - vt
    delta = _f8(y if term else x)
    return delta if done else fma(gl, an, delta)


@njit(inline="always", fastmath=_FM)
def _row_next(r, v, nv, d, tr, adv, ret, i, t, g, gl, a):
    """One step of row ``i`` at ``t`` with next values (see :func:`_nstep`)."""
    x = v[i, t]
    dt = d[i, t] != 0
    a = _nstep(r[i, t], x, nv[i, t], dt, dt | (tr[i, t] != 0), g, gl, a)
    o = adv.dtype.type(a)
    adv[i, t] = o
    ret[i, t] = o + x
    return a


@njit(inline="always", fastmath=_FM)
def _row_mask(r, v, d, m, adv, ret, i, t, has_term, g, gl, a, vn):
    """One masked step of row ``i`` at ``t`` (see :func:`_mstep`)."""
    ft = adv.dtype.type
    a, vn, b, w = _mstep(r[i, t], v[i, t], _flag_at(d, has_term, i, t), m[i, t] != 0, g, gl, a, vn, ft(0))
    o = ft(b)
    adv[i, t] = o
    ret[i, t] = o + w
    return a, vn


@njit(inline="always", fastmath=_FM)
def _row_term(r, v, d, adv, ret, i, t, g, gl, a, vn):
    """One step of row ``i`` at ``t`` with terminations (see :func:`_gstep`)."""
    x = v[i, t]
    a = _gstep(r[i, t], x, vn, d[i, t] != 0, g, gl, a)
    o = adv.dtype.type(a)
    adv[i, t] = o
    ret[i, t] = o + x
    return a, x


@njit(inline="always", fastmath=_FM)
def _row_plain(r, v, adv, ret, i, t, g, gl, a, vn):
    """One step of row ``i`` at ``t`` without flags."""
    x = v[i, t]
    a = fma(gl, a, _f8(fma(g, vn, r[i, t]) - x))
    o = adv.dtype.type(a)
    adv[i, t] = o
    ret[i, t] = o + x
    return a, x


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_pair(r, v, nv, d, tr, m, adv, ret, i, k, has_next, has_term, has_mask,
              g0, gl0, g1, gl1, vl0, vl1, al0, al1):
    """Rows ``i`` and ``k`` in one loop: two independent chains hide each
    other's FMA-and-select latency, which bounds a lone chain.  Row ``k``
    runs :data:`PAIR_LAG` steps behind row ``i`` (see :func:`scan_rows`:
    the same step of two rows of a power-of-two length falls in one cache
    set); the first ``L`` steps of row ``i`` and the last ``L`` of row ``k``
    run alone.  ``k == i`` runs one row as both chains: they compute the
    same bits and store them twice, in about the time of the lone chain."""
    T = r.shape[1]
    a0 = al0
    a1 = al1
    v0 = vl0
    v1 = vl1
    L = min(PAIR_LAG, T)
    # Step j of row i is at T − 1 − j; row k takes step j − L meanwhile.
    if has_next:
        for j in range(L):
            a0 = _row_next(r, v, nv, d, tr, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0)
        for j in range(L, T):
            a0 = _row_next(r, v, nv, d, tr, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0)
            a1 = _row_next(r, v, nv, d, tr, adv, ret, k, np.uint64(T - 1 - j + L), g1, gl1, a1)
        for j in range(T - L, T):
            a1 = _row_next(r, v, nv, d, tr, adv, ret, k, np.uint64(T - 1 - j), g1, gl1, a1)
    elif has_mask:
        for j in range(L):
            a0, v0 = _row_mask(r, v, d, m, adv, ret, i, np.uint64(T - 1 - j), has_term, g0, gl0, a0, v0)
        for j in range(L, T):
            a0, v0 = _row_mask(r, v, d, m, adv, ret, i, np.uint64(T - 1 - j), has_term, g0, gl0, a0, v0)
            a1, v1 = _row_mask(r, v, d, m, adv, ret, k, np.uint64(T - 1 - j + L), has_term, g1, gl1, a1, v1)
        for j in range(T - L, T):
            a1, v1 = _row_mask(r, v, d, m, adv, ret, k, np.uint64(T - 1 - j), has_term, g1, gl1, a1, v1)
    elif has_term:
        for j in range(L):
            a0, v0 = _row_term(r, v, d, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0, v0)
        for j in range(L, T):
            a0, v0 = _row_term(r, v, d, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0, v0)
            a1, v1 = _row_term(r, v, d, adv, ret, k, np.uint64(T - 1 - j + L), g1, gl1, a1, v1)
        for j in range(T - L, T):
            a1, v1 = _row_term(r, v, d, adv, ret, k, np.uint64(T - 1 - j), g1, gl1, a1, v1)
    else:
        for j in range(L):
            a0, v0 = _row_plain(r, v, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0, v0)
        for j in range(L, T):
            a0, v0 = _row_plain(r, v, adv, ret, i, np.uint64(T - 1 - j), g0, gl0, a0, v0)
            a1, v1 = _row_plain(r, v, adv, ret, k, np.uint64(T - 1 - j + L), g1, gl1, a1, v1)
        for j in range(T - L, T):
            a1, v1 = _row_plain(r, v, adv, ret, k, np.uint64(T - 1 - j), g1, gl1, a1, v1)


@njit(inline="always", fastmath=_FM)
def _gae_row_uncarried(r, v, nv, d, tr, m, adv, ret, i, has_next, has_term, has_mask, g, vl):
    """Row ``i`` whose decay γλ is zero: ``A_t = δ_t``, each step without the
    carry (a zero decay drops it, as a done does, so that a NaN or an
    infinity at a later step reaches no earlier one).  The steps of
    :func:`_gae_pair` with a carry of 0 in and out, so no chain to hide."""
    T = r.shape[1]
    z = _f8(0.0)
    vn = vl
    if has_next:
        for j in range(T):
            _row_next(r, v, nv, d, tr, adv, ret, i, np.uint64(T - 1 - j), g, z, z)
    elif has_mask:
        for j in range(T):
            _, vn = _row_mask(r, v, d, m, adv, ret, i, np.uint64(T - 1 - j), has_term, g, z, z, vn)
    elif has_term:
        for j in range(T):
            _, vn = _row_term(r, v, d, adv, ret, i, np.uint64(T - 1 - j), g, z, z, vn)
    else:
        for j in range(T):
            _, vn = _row_plain(r, v, adv, ret, i, np.uint64(T - 1 - j), g, z, z, vn)


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_rows_apart(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                    gcol, bound, carry, adv, ret, i, gl, k, hl):
    """Rows ``i`` and ``k`` (``k == i``: one row) each alone, a row whose
    decay (``gl``, ``hl``) is zero without the carry, any other as both chains
    of :func:`_gae_pair`.  A function of its own: the pair loop's caller stays small."""
    for q in range(2 if k != i else 1):
        row = i if q == 0 else k
        decay = gl if q == 0 else hl
        g = gcol[row]
        if decay == 0:
            _gae_row_uncarried(rewards, values, next_values, term, trunc, mask, adv, ret, row, has_next, has_term,
                               has_mask, g, bound[row])
        else:
            c = _f8(carry[row])
            _gae_pair(rewards, values, next_values, term, trunc, mask, adv, ret, row, row, has_next, has_term,
                      has_mask, g, decay, g, decay, bound[row], bound[row], c, c)


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_unit(u, rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
              gcol, lcol, bound, carry, adv, ret):
    # Work unit u: rows 2u and 2u + 1, or the last row as both chains when R
    # is odd (one loop body to compile, not a second one for a lone row).
    # γ enters δ in the data dtype; γλ, the decay of the carried A, is
    # ``_f8``, float64 outside the float32-state builds (γλ rounded to float32
    # would drift like a float32 state).  A zero γλ in either row: the rows apart.
    i = 2 * np.int64(u)
    k = i + 1 if i + 1 < rewards.shape[0] else i
    g = gcol[i]
    h = gcol[k]
    gl = _f8(g) * _f8(lcol[i])
    hl = _f8(h) * _f8(lcol[k])
    if gl == 0 or hl == 0:
        _gae_rows_apart(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                        gcol, bound, carry, adv, ret, i, gl, k, hl)
        return
    _gae_pair(rewards, values, next_values, term, trunc, mask, adv, ret, i, k, has_next, has_term, has_mask,
              g, gl, h, hl, bound[i], bound[k], _f8(carry[i]), _f8(carry[k]))


_B = types.boolean
_FUSED_SIGS = [
    types.void(_ro(ft, 2), _ro(ft, 2), _ro(ft, 2), _B, _U8A, _B, _U8A, _U8A, _B,
               _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), types.Array(ft, 2, "A"), types.Array(ft, 2, "A"))
    for ft in _FLOATS
]


@kernel(_FUSED_SIGS, parallel=True, fastmath=_FM)
def gae_rows_fused(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                   gcol, lcol, bound, carry, adv, ret):
    """Batch-major fused GAE, scalar or per-row γ/λ, any strides, rows in
    pairs (see :func:`_gae_pair`), one loop per case: terminations; masks
    (with or without terminations); ``next_values`` with terminations and
    truncations (``term`` and ``trunc`` then both read, zero-stride views of 0
    when absent).  Flags are uint8 views (nonzero = true); ``term`` is read
    only when ``has_term`` or ``has_next``, ``mask`` only when ``has_mask``.
    (Masks together with ``next_values`` take the general kernel.)

    Pairing rows hides a chain's latency with no extra pass over memory (a
    chunked in-row scan needs a carry pass and a rescan or fix-up, which cost
    more than they hide; figures in ``benchmarks/results/``).
    """
    for u in prange((rewards.shape[0] + 1) // 2):
        # prange's index is unsigned, range's (the serial build) signed: one type
        # for both lets them share the helper's compiled (and cached) code.
        _gae_unit(np.int64(u), rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                  gcol, lcol, bound, carry, adv, ret)


@kernel(_FUSED_SIGS, fastmath=_FM)
def gae_rows_fused_1t(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                      gcol, lcol, bound, carry, adv, ret):
    """:func:`gae_rows_fused` on the calling thread: for small problems, where
    waking the thread pool costs more than the work (same code, same bits)."""
    for u in range((rewards.shape[0] + 1) // 2):
        _gae_unit(u, rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                  gcol, lcol, bound, carry, adv, ret)


# The same two kernels for C-contiguous rows: rewards, values, next values,
# terminations and both outputs typed "C" (truncations and masks stay "A":
# absent ones are zero-stride views).  Numba then indexes with the inner
# stride known at compile time; on strided ("A") arrays it multiplies a
# runtime stride at every access, which costs the float64 loop with
# terminations a large part of its speed (benchmarks/results/*-c-layout.txt).
def _c2(dtype: types.Type, readonly: bool = True) -> types.Array:
    return types.Array(dtype, 2, "C", readonly=readonly)


_FUSED_C_SIGS = [
    types.void(_c2(ft), _c2(ft), _c2(ft), _B, _c2(types.uint8), _B, _U8A, _U8A, _B,
               _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), _c2(ft, False), _c2(ft, False))
    for ft in _FLOATS
]
gae_rows_fused_c = kernel(_FUSED_C_SIGS, parallel=True, fastmath=_FM)(
    _renamed(gae_rows_fused.py_func, "_c", globals()))
gae_rows_fused_1t_c = kernel(_FUSED_C_SIGS, fastmath=_FM)(_renamed(gae_rows_fused_1t.py_func, "_c", globals()))


# Eight rows in the lanes of one SIMD register (see :mod:`gaescan.kernels._lanes`),
# 16 steps a block: each row's loads and stores are whole 64-byte lines (blocks of
# 8 and 32 steps are slower: benchmarks/results/*-lanes_block_steps.txt).  The blocks
# with a float64 state; the float32-state namespace (:func:`_f4_namespace`) holds the
# float32-state ones under the same names.
_LANE_STEPS = 16
_LANE_CASES = {"term": dict(has_term=True), "plain": dict(has_term=False),
               "next": dict(has_term=True, has_next=True), "mask_term": dict(has_term=True, has_mask=True),
               "mask": dict(has_term=False, has_mask=True)}


def _lane_blocks(wide: bool) -> dict[str, Any]:
    """Every block of one state width: ``_lanes_<case>`` (rows ``i0 ..
    i0 + 7``) and ``_planes_<case>`` (eight places of one packed row)."""
    blocks = {}
    for case, kw in _LANE_CASES.items():
        for prefix, packed in (("_lanes", False), ("_planes", True)):
            blocks[f"{prefix}_{case}"] = lanes_block(wide=wide, steps=_LANE_STEPS, packed=packed, **kw)
    return blocks


_LANES_F8 = _lane_blocks(True)
_LANES_F4 = _lane_blocks(False)
(_lanes_term, _lanes_plain, _lanes_next, _lanes_mask_term, _lanes_mask,
 _planes_term, _planes_plain, _planes_next, _planes_mask_term, _planes_mask) = (
    _LANES_F8[f"{prefix}_{case}"] for prefix in ("_lanes", "_planes") for case in _LANE_CASES)
_F4T = types.float32


# One block of the case at hand.  Each block reads the arrays its option needs
# (see lanes_block): ``next_values`` and ``trunc`` with next values, ``mask``
# with a mask.
@njit(inline="always")
def _rows_block(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                i0, t0, sa, sv, g8, gl8, adv, ret, stream, skew):
    """The block of rows ``i0 .. i0 + 7``, steps ``t0 + q·skew .. t0 + q·skew + 15`` in lane ``q``."""
    if has_next:
        _lanes_next(rewards, values, term, adv, ret, i0, t0, sa, sv, g8, gl8, next_values, trunc, stream, skew)
    elif has_mask and has_term:
        _lanes_mask_term(rewards, values, term, adv, ret, i0, t0, sa, sv, g8, gl8, next_values, mask, stream, skew)
    elif has_mask:
        _lanes_mask(rewards, values, term, adv, ret, i0, t0, sa, sv, g8, gl8, next_values, mask, stream, skew)
    elif has_term:
        _lanes_term(rewards, values, term, adv, ret, i0, t0, sa, sv, g8, gl8, next_values, trunc, stream, skew)
    else:
        _lanes_plain(rewards, values, term, adv, ret, i0, t0, sa, sv, g8, gl8, next_values, trunc, stream, skew)


@njit(inline="always")
def _packed_block(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                  starts, sa, sv, g8, gl8, adv, ret, stream):
    """The block of steps ``starts[q] .. starts[q] + 15`` of row 0 in lane ``q``."""
    if has_next:
        _planes_next(rewards, values, term, adv, ret, starts, 0, sa, sv, g8, gl8, next_values, trunc, stream, 0)
    elif has_mask and has_term:
        _planes_mask_term(rewards, values, term, adv, ret, starts, 0, sa, sv, g8, gl8, next_values, mask, stream, 0)
    elif has_mask:
        _planes_mask(rewards, values, term, adv, ret, starts, 0, sa, sv, g8, gl8, next_values, mask, stream, 0)
    elif has_term:
        _planes_term(rewards, values, term, adv, ret, starts, 0, sa, sv, g8, gl8, next_values, trunc, stream, 0)
    else:
        _planes_plain(rewards, values, term, adv, ret, starts, 0, sa, sv, g8, gl8, next_values, trunc, stream, 0)


@njit(inline="always", fastmath=_FM)
def _lane_steps(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                i, hi, lo, g, gl, a, vn, zero, adv, ret):
    """Steps ``hi − 1`` down to ``lo`` of float32 row ``i``, one at a time, with
    the step of the lanes blocks (:func:`_nstep`, :func:`_mstep` or
    :func:`_gstep`: the same bits); returns the carried ``(A, V')``."""
    for t in range(hi - 1, lo - 1, -1):
        x = values[i, t]
        w = x
        if has_next:
            d = term[i, t] != 0
            a = _nstep(rewards[i, t], x, next_values[i, t], d, d | (trunc[i, t] != 0), g, gl, a)
            o = np.float32(a)
        elif has_mask:
            a, vn, b, w = _mstep(rewards[i, t], x, _flag_at(term, has_term, i, t), mask[i, t] != 0,
                                 g, gl, a, vn, zero)
            o = np.float32(b)
        else:
            a = _gstep(rewards[i, t], x, vn, _flag_at(term, has_term, i, t), g, gl, a)
            o = np.float32(a)
            vn = x
        adv[i, t] = o
        ret[i, t] = o + w
    return a, vn


@kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _B, _U8A, _B, _U8A, _U8A, _B, _ro(_F4T, 1),
                    _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), types.int64, _B, types.Array(_F4T, 2, "A"),
                    types.Array(_F4T, 2, "A")), None],
        parallel=True, fastmath=_FM)
def gae_lanes(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
              gcol, lcol, bound, carry, phase, stream, adv, ret):
    """Batch-major fused GAE on float32 rows contiguous along time, eight rows
    at a time in SIMD lanes: rows ``0 .. 8·(R // 8) − 1`` (the caller runs the
    others through :func:`gae_rows_fused`, which takes the same arguments
    less ``phase`` and ``stream``).

    The cases of :func:`gae_rows_fused`: plain or with terminations; a mask
    (with or without terminations); ``next_values`` with terminations and
    truncations, which must both be given here (``term`` and ``trunc`` are
    read as arrays contiguous along time, not as zero-stride views).

    The blocks of 16 steps start at steps ``phase + 16·k`` (``phase`` <
    16; 0 where the row is shorter than ``phase + 16``, and then the blocks
    write by ordinary stores), lane ``q``'s ``q·sk`` steps after lane 0's
    (:func:`_lane_span`).  Each group of 8 rows first runs each row's steps
    after its last block one row at a time
    (:func:`_lane_steps`: the step of :func:`_gstep`, :func:`_mstep` or
    :func:`_nstep`), then its blocks from the end, each one call of a
    ``_lanes_*`` block (:func:`_rows_block`): eight independent chains per
    instruction, where :func:`_gae_pair` runs two; then each row's steps
    before its first block one row at a time.  The same operations as
    :func:`_gae_pair`, so the same bits, whatever ``phase`` and ``sk``.
    Every array it reads must be contiguous along time (the block addresses
    rows by their stride and steps by the item size).

    With ``stream`` the blocks write by non-temporal stores: the caller
    guarantees that step ``phase`` of every row of ``adv`` and ``ret`` starts
    a 32-byte aligned vector.
    """
    R, T = rewards.shape
    h0, nb, tb, nt, sk = _lane_span(T, phase, stream)
    zero = np.float32(0)
    for grp in prange(R // 8):
        i0 = grp * 8
        sa = np.empty(8, _f8)
        sv = np.empty(8, np.float32)
        g8 = np.empty(8, np.float32)
        gl8 = np.empty(8, _f8)
        for q in range(8):
            i = i0 + q
            g = gcol[i]
            gl = _f8(g) * _f8(lcol[i])
            a, vn = _lane_steps(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                                i, T, tb + q * sk, g, gl, _f8(carry[i]), bound[i], zero, adv, ret)
            sa[q] = a
            sv[q] = vn
            g8[q] = g
            gl8[q] = gl
        for b in range(nb):
            _rows_block(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                        i0, tb - _LANE_STEPS * (b + 1), sa, sv, g8, gl8, adv, ret, nt, sk)
        for q in range(8):
            _lane_steps(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                        i0 + q, h0 + q * sk, 0, g8[q], gl8[q], _f8(sa[q]), sv[q], zero, adv, ret)
        if nt:
            sfence()


# One step of eight columns of time-major arrays, per case and state width,
# asking for the inputs _TM_PREFETCH_STEPS steps ahead (distances of 4 to 16
# steps measured alike: benchmarks/results/*-time-major-lanes.txt).
_TM_PREFETCH_STEPS = 8
_TM_LANES = {(case, wide): lanes_block(wide=wide, steps=1, time_major=True, prefetch=_TM_PREFETCH_STEPS,
                                       **_LANE_CASES[case])
             for case in ("term", "plain", "next") for wide in (True, False)}
_tmlanes_term, _tmlanes_plain, _tmlanes_next = (_TM_LANES[case, True] for case in ("term", "plain", "next"))


@njit(inline="always")
def _tm_split(R, phase, units):
    """``(v0, r8, line, wb, nb)`` of a time-major lanes kernel whose outputs
    start a 64-byte line at column ``phase`` (< 16) of each row: columns
    ``v0 = phase % 8 .. r8 − 1`` run eight per vector (``v0`` at most ``R``),
    in ``nb`` units of ``wb`` columns (a multiple of 16; a narrow batch gets
    ``units`` of them, the caller's thread count, of at least 64 columns each:
    each unit sweeps every step, so fewer, wider units read longer runs of
    each row) split at columns ``line + m·wb`` (``line = phase``): at line
    boundaries of the outputs, so that no two threads write one line.
    Columns are independent, so the split changes no result."""
    v0 = min(phase % 8, R)
    r8 = v0 + (R - v0) // 8 * 8
    n = r8 - v0
    u = max(np.int64(1), units)
    wb = _W if n >= u * _W else max(64, ((n + u - 1) // u + 15) // 16 * 16)
    line = min(phase, r8)
    return v0, r8, line, wb, max(1, (r8 - line + wb - 1) // wb)


@njit(inline="always")
def _tm_unit(bb, R, v0, r8, line, wb, nb):
    """Unit ``bb``: ``(c0, c1, lo, hi)``, its vector columns ``c0 .. c1 − 1``
    and all its columns ``lo .. hi − 1`` (the first unit also takes the
    columns before ``v0``, the last those after ``r8``)."""
    c0 = v0 if bb == 0 else line + np.int64(bb) * wb
    c1 = min(line + (np.int64(bb) + 1) * wb, r8)
    return c0, c1, 0 if bb == 0 else c0, R if bb == nb - 1 else c1


@njit(inline="always", fastmath=_FM)
def _tm_cols(rewards, values, next_values, has_next, term, has_term, trunc, t, c0, c1, lo, an, vn, gg, gl,
             adv, ret):
    """Step ``t`` of columns ``c0 .. c1 − 1``, one at a time (the step of
    :func:`gae_timemajor` or :func:`gae_timemajor_next`); the carries of
    column ``c`` at ``c − lo``."""
    for c in range(c0, c1):
        k = c - lo
        v = values[t, c]
        if has_next:
            e = term[t, c] != 0
            a = _nstep(rewards[t, c], v, next_values[t, c], e, e | (trunc[t, c] != 0), gg[k], gl[k], an[k])
        elif has_term:
            a = _gstep(rewards[t, c], v, vn[k], term[t, c] != 0, gg[k], gl[k], an[k])
        else:
            a = _f8(rewards[t, c] + gg[k] * vn[k] - v) + gl[k] * an[k]
        o = np.float32(a)
        adv[t, c] = o
        ret[t, c] = o + v
        an[k] = a
        vn[k] = v


@kernel([types.void(_c2(_F4T), _c2(_F4T), _c2(_F4T), _B, _U8A, _B, _U8A, _ro(_F4T, 1), _ro(_F4T, 1),
                    _ro(_F4T, 1), _ro(_F4T, 1), types.int64, _B, types.int64, types.Array(_F4T, 2, "A"),
                    types.Array(_F4T, 2, "A")), None],
        parallel=True, fastmath=_FM)
def gae_timemajor_lanes(rewards, values, next_values, has_next, term, has_term, trunc, gcol, lcol, bound, carry,
                        phase, stream, units, adv, ret):
    """:func:`gae_timemajor` (plain or with terminations) and
    :func:`gae_timemajor_next` (``has_next``: ``term`` and ``trunc`` both read)
    on float32 ``(T, R)`` arrays, eight columns per SIMD vector from column
    ``phase % 8`` on: each step of them one vector load per array and one
    vector store per output, non-temporal with ``stream`` (the caller
    guarantees that column ``phase`` of every row of ``adv`` and ``ret``
    starts a 64-byte line, :func:`_tm_split`).  The flags it reads must
    have consecutive columns.  The first ``phase % 8`` columns and the last
    ``(R − phase % 8) % 8`` run one at a time.  ``units``, the caller's
    thread count, sets how many units a narrow batch's columns are split
    into (:func:`_tm_split`; columns are independent, so no result depends
    on it).  The steps of :func:`_gstep` and :func:`_nstep`, so the same bits
    as those kernels."""
    T, R = rewards.shape
    v0, r8, line, wb, nb = _tm_split(R, phase, units)
    for bb in prange(nb):
        c0, c1, lo, hi = _tm_unit(bb, R, v0, r8, line, wb, nb)
        an = np.empty(hi - lo, _f8)
        vn = np.empty(hi - lo, np.float32)
        gg = np.empty(hi - lo, np.float32)
        gl = np.empty(hi - lo, _f8)
        for k in range(hi - lo):
            an[k] = carry[lo + k]
            vn[k] = bound[lo + k]
            gg[k] = gcol[lo + k]
            gl[k] = _f8(gcol[lo + k]) * _f8(lcol[lo + k])
        for j in range(T):
            t = T - 1 - j
            _tm_cols(rewards, values, next_values, has_next, term, has_term, trunc, t, lo, c0, lo, an, vn, gg, gl,
                     adv, ret)
            for c in range(c0, c1, 8):
                k = c - lo
                if has_next:
                    _tmlanes_next(rewards, values, term, adv, ret, c, t, an[k:], vn[k:], gg[k:], gl[k:],
                                  next_values, trunc, stream, 0)
                elif has_term:
                    _tmlanes_term(rewards, values, term, adv, ret, c, t, an[k:], vn[k:], gg[k:], gl[k:],
                                  rewards, term, stream, 0)
                else:
                    _tmlanes_plain(rewards, values, term, adv, ret, c, t, an[k:], vn[k:], gg[k:], gl[k:],
                                   rewards, term, stream, 0)
            _tm_cols(rewards, values, next_values, has_next, term, has_term, trunc, t, c1, hi, lo, an, vn, gg, gl,
                     adv, ret)
        if stream:
            sfence()


# Time-major scans and discounted returns likewise: one step of eight columns
# per block, the general kernels' steps (no FMA), the inputs prefetched.
_tmscan_rev = scan_block("scan", True, prefetch=_TM_PREFETCH_STEPS)
_tmscan_fwd = scan_block("scan", False, prefetch=_TM_PREFETCH_STEPS)
_tmret_term = scan_block("returns", True, has_term=True, prefetch=_TM_PREFETCH_STEPS)
_tmret_plain = scan_block("returns", True, has_term=False, prefetch=_TM_PREFETCH_STEPS)


@kernel([types.void(_c2(_F4T), _c2(_F4T), _B, _ro(_F4T, 1), types.int64, _B, types.int64,
                    types.Array(_F4T, 2, "A")), None],
        parallel=True)
def scan_timemajor_lanes(a, b, reverse, initial, phase, stream, units, out):
    """:func:`scan_tm` on float32 ``(T, R)`` C-contiguous arrays, eight columns
    per SIMD vector from column ``phase % 8`` on (:func:`scan_block`),
    written by non-temporal stores with ``stream`` (the caller guarantees
    that column ``phase`` of every row of ``out`` starts a 64-byte line,
    :func:`_tm_split`); the columns before and after run one at a time;
    ``units`` as in :func:`gae_timemajor_lanes`.  The step of
    :func:`_scan_at`, so the same bits as :func:`scan_tm`."""
    T, R = b.shape
    v0, r8, line, wb, nb = _tm_split(R, phase, units)
    for bb in prange(nb):
        c0, c1, lo, hi = _tm_unit(bb, R, v0, r8, line, wb, nb)
        y = np.empty(hi - lo, _f8)
        for k in range(hi - lo):
            y[k] = initial[lo + k]
        for j in range(T):
            t = T - 1 - j if reverse else j
            for c in range(lo, c0):
                y[c - lo] = _scan_at(a, b, np.uint64(t), np.uint64(c), y[c - lo], out)
            for c in range(c0, c1, 8):
                if reverse:
                    _tmscan_rev(a, b, b, out, c, t, y[c - lo:], initial, stream, 0)
                else:
                    _tmscan_fwd(a, b, b, out, c, t, y[c - lo:], initial, stream, 0)
            for c in range(c1, hi):
                y[c - lo] = _scan_at(a, b, np.uint64(t), np.uint64(c), y[c - lo], out)
        if stream:
            sfence()


@njit(inline="always")
def _tm_ret_at(rewards, term, has_term, t, c, g, G, out):
    """The step of :func:`_ret_at` without a mask, γ per column."""
    x = _f8(rewards[t, c])
    G = x if _flag_at(term, has_term, t, c) else x + _f8(g) * G
    out[t, c] = G
    return G


@kernel([types.void(_c2(_F4T), _U8A, _B, _ro(_F4T, 1), _ro(_F4T, 1), types.int64, _B, types.int64,
                    types.Array(_F4T, 2, "A")), None],
        parallel=True)
def returns_timemajor_lanes(rewards, term, has_term, gcol, bound, phase, stream, units, out):
    """:func:`returns_tm` without a mask, γ per column (``gcol``), on float32
    ``(T, R)`` arrays (``rewards`` C-contiguous; ``term``, read with
    ``has_term``, with consecutive columns), eight columns per SIMD vector
    as in :func:`scan_timemajor_lanes` (``units`` too).  The step of
    :func:`_ret_at`, so the same bits as :func:`returns_tm`."""
    T, R = rewards.shape
    v0, r8, line, wb, nb = _tm_split(R, phase, units)
    for bb in prange(nb):
        c0, c1, lo, hi = _tm_unit(bb, R, v0, r8, line, wb, nb)
        G = np.empty(hi - lo, _f8)
        gg = np.empty(hi - lo, np.float32)
        for k in range(hi - lo):
            G[k] = bound[lo + k]
            gg[k] = gcol[lo + k]
        for j in range(T):
            t = T - 1 - j
            for c in range(lo, c0):
                G[c - lo] = _tm_ret_at(rewards, term, has_term, t, c, gg[c - lo], G[c - lo], out)
            for c in range(c0, c1, 8):
                if has_term:
                    _tmret_term(rewards, rewards, term, out, c, t, G[c - lo:], gg[c - lo:], stream, 0)
                else:
                    _tmret_plain(rewards, rewards, term, out, c, t, G[c - lo:], gg[c - lo:], stream, 0)
            for c in range(c1, hi):
                G[c - lo] = _tm_ret_at(rewards, term, has_term, t, c, gg[c - lo], G[c - lo], out)
        if stream:
            sfence()


@njit(inline="always")
def _enter(cu, bound, carry, s, pos, lo, sa, sv, q):
    """Lane ``q`` takes sequence ``s``: its end, its start, and the state
    past its end (``last_advantage``, ``last_value``)."""
    pos[q] = cu[s + 1]
    lo[q] = cu[s]
    sa[q] = carry[s]
    sv[q] = bound[s]


@kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _B, _U8A, _B, _U8A, _U8A, _B, _ro(_F4T, 1),
                    _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), _CU, _CU, _CU, types.int64, _B,
                    types.Array(_F4T, 2, "A"), types.Array(_F4T, 2, "A")), None],
        parallel=True, fastmath=_FM)
def gae_packed_lanes(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                     gcol, lcol, bound, carry, cu, order, groups, phase, stream, adv, ret):
    """Fused GAE on one float32 row of packed sequences (``cu`` the offsets,
    scalar γ = ``gcol[0]`` and λ = ``lcol[0]``), eight sequences at a time in
    SIMD lanes.  Group ``u`` (one per ``prange`` iteration) runs sequences
    ``order[groups[u] : groups[u + 1]]`` in that order: each of its eight
    lanes takes the next one when it finishes its own.

    The cases and arguments of :func:`gae_lanes` (rows ``[1, N]``, every array
    contiguous along time), plus ``cu``, ``order``, ``groups`` and
    ``phase``; ``bound`` and ``carry`` are per sequence.  A lane enters a
    sequence with that sequence's ``carry`` and ``bound`` and runs its last
    steps one at a time (:func:`_lane_steps`) down to a step ``t`` with
    ``t − phase`` a multiple of 16 (the caller picks ``phase`` so that blocks
    are whole 64-byte lines of the outputs: a block that straddles lines
    costs more).  While every lane has 16 steps or more left in its
    sequence, blocks of 16 steps run in the lanes (the ``_planes_*`` blocks:
    a start per lane); a lane with fewer runs them one at a time and takes
    its next sequence.  Once the group has no sequence left to take, the
    lanes finish theirs one at a time: the caller orders each group's
    sequences longest first, so that those last ones are short.  With
    ``stream`` the blocks write by non-temporal stores: the caller guarantees
    that ``phase`` starts a 32-byte aligned vector of both ``adv`` and ``ret``.

    Every step is the step of :func:`gae_lanes`, so each sequence's results
    are the bits of :func:`gae_rows_fused` on that sequence as a row: how
    sequences fall into groups and lanes changes no result.
    """
    g = gcol[0]
    gl = _f8(g) * _f8(lcol[0])
    zero = np.float32(0)
    for grp in prange(groups.shape[0] - 1):
        nxt = groups[grp]
        end = groups[grp + 1]
        starts = np.empty(8, np.int64)
        pos = np.zeros(8, np.int64)
        lo = np.zeros(8, np.int64)
        busy = np.zeros(8, np.bool_)
        sa = np.empty(8, _f8)
        sv = np.empty(8, np.float32)
        g8 = np.full(8, g, np.float32)
        gl8 = np.full(8, gl, _f8)
        while True:
            nblk = np.int64(1) << 62
            for q in range(8):
                while True:
                    if not busy[q]:
                        if nxt == end:
                            break
                        _enter(cu, bound, carry, order[nxt], pos, lo, sa, sv, q)
                        nxt += 1
                        busy[q] = True
                    # the steps down to a block end at a multiple of 16 from ``phase``
                    k = (pos[q] - phase) % _LANE_STEPS
                    if pos[q] - k - lo[q] >= _LANE_STEPS:
                        if k:
                            sa[q], sv[q] = _lane_steps(rewards, values, next_values, has_next, term, has_term,
                                                       trunc, mask, has_mask, 0, pos[q], pos[q] - k, g, gl,
                                                       _f8(sa[q]), sv[q], zero, adv, ret)
                            pos[q] -= k
                        break
                    _lane_steps(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                                0, pos[q], lo[q], g, gl, _f8(sa[q]), sv[q], zero, adv, ret)
                    busy[q] = False
                nblk = min(nblk, (pos[q] - lo[q]) // _LANE_STEPS if busy[q] else 0)
            if nblk == 0:
                break
            for _b in range(nblk):
                for q in range(8):
                    pos[q] -= _LANE_STEPS
                    starts[q] = pos[q]
                _packed_block(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                              starts, sa, sv, g8, gl8, adv, ret, stream)
        for q in range(8):
            if busy[q]:
                _lane_steps(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                            0, pos[q], lo[q], g, gl, _f8(sa[q]), sv[q], zero, adv, ret)
        if stream:
            sfence()


@njit(inline="always", fastmath=_FM)
def _seq_step(r, v, nv, d, tr, m, adv, ret, has_next, has_term, has_mask, t, g, gl, a, vn):
    """Step ``t`` of row 0 with the step of :func:`_gae_pair` for the case."""
    if has_next:
        a = _row_next(r, v, nv, d, tr, adv, ret, 0, t, g, gl, a)
    elif has_mask:
        a, vn = _row_mask(r, v, d, m, adv, ret, 0, t, has_term, g, gl, a, vn)
    elif has_term:
        a, vn = _row_term(r, v, d, adv, ret, 0, t, g, gl, a, vn)
    else:
        a, vn = _row_plain(r, v, adv, ret, 0, t, g, gl, a, vn)
    return a, vn


@njit(inline="always", fastmath=_FM)
def _seq_pair(r, v, nv, d, tr, m, adv, ret, has_next, has_term, has_mask, e0, e1, k, g, gl, a0, v0, a1, v1):
    """The last ``k`` steps of the sequences of row 0 that end at ``e0`` and
    ``e1``, in one loop per case as :func:`_gae_pair` runs two rows."""
    if has_next:
        for j in range(k):
            a0 = _row_next(r, v, nv, d, tr, adv, ret, 0, np.uint64(e0 - 1 - j), g, gl, a0)
            a1 = _row_next(r, v, nv, d, tr, adv, ret, 0, np.uint64(e1 - 1 - j), g, gl, a1)
    elif has_mask:
        for j in range(k):
            a0, v0 = _row_mask(r, v, d, m, adv, ret, 0, np.uint64(e0 - 1 - j), has_term, g, gl, a0, v0)
            a1, v1 = _row_mask(r, v, d, m, adv, ret, 0, np.uint64(e1 - 1 - j), has_term, g, gl, a1, v1)
    elif has_term:
        for j in range(k):
            a0, v0 = _row_term(r, v, d, adv, ret, 0, np.uint64(e0 - 1 - j), g, gl, a0, v0)
            a1, v1 = _row_term(r, v, d, adv, ret, 0, np.uint64(e1 - 1 - j), g, gl, a1, v1)
    else:
        for j in range(k):
            a0, v0 = _row_plain(r, v, adv, ret, 0, np.uint64(e0 - 1 - j), g, gl, a0, v0)
            a1, v1 = _row_plain(r, v, adv, ret, 0, np.uint64(e1 - 1 - j), g, gl, a1, v1)
    return a0, v0, a1, v1


_F8T = types.float64


@kernel([None, types.void(_ro(_F8T, 2), _ro(_F8T, 2), _ro(_F8T, 2), _B, _U8A, _B, _U8A, _U8A, _B, _ro(_F8T, 1),
                          _ro(_F8T, 1), _ro(_F8T, 1), _ro(_F8T, 1), _CU, types.Array(_F8T, 2, "A"),
                          types.Array(_F8T, 2, "A"))],
        narrow=False, parallel=True, fastmath=_FM)
def gae_packed_pairs(rewards, values, next_values, has_next, term, has_term, trunc, mask, has_mask,
                     gcol, lcol, bound, carry, cu, adv, ret):
    """Fused GAE on one float64 row of packed sequences (``cu`` the offsets,
    scalar γ = ``gcol[0]`` and λ = ``lcol[0]``, γλ nonzero), sequences ``2u``
    and ``2u + 1`` in one loop: two independent chains, as :func:`_gae_pair`
    runs two rows, each sequence from its end; the longer one's first steps
    then run alone.  The cases and flag arguments of :func:`gae_rows_fused`
    (``bound`` and ``carry`` per sequence; with ``next_values`` both flags
    read, zero-stride views of 0 when absent).  Float32 packed calls run
    :func:`gae_packed_lanes` or the general kernel (see
    :mod:`gaescan.backends.numba_cpu`).

    Every step is the step of :func:`_gae_pair`, so each sequence's results
    are the bits of :func:`gae_rows_fused` on that sequence as a row.
    """
    g = gcol[0]
    gl = _f8(g) * _f8(lcol[0])
    n = cu.shape[0] - 1
    for u in prange((n + 1) // 2):
        s0 = 2 * np.int64(u)
        s1 = s0 + 1 if s0 + 1 < n else s0
        e0 = cu[s0 + 1]
        e1 = cu[s1 + 1]
        n0 = e0 - cu[s0]
        n1 = e1 - cu[s1] if s1 != s0 else np.int64(0)
        a0 = _f8(carry[s0])
        v0 = bound[s0]
        a1 = _f8(carry[s1])
        v1 = bound[s1]
        k = min(n0, n1)
        a0, v0, a1, v1 = _seq_pair(rewards, values, next_values, term, trunc, mask, adv, ret, has_next, has_term,
                                   has_mask, e0, e1, k, g, gl, a0, v0, a1, v1)
        # the longer sequence's first steps, in one loop for either
        e, m, a, vn = (e0, n0, a0, v0) if n0 > k else (e1, n1, a1, v1)
        for j in range(k, m):
            a, vn = _seq_step(rewards, values, next_values, term, trunc, mask, adv, ret, has_next, has_term,
                              has_mask, np.uint64(e - 1 - j), g, gl, a, vn)


@kernel(
    [types.void(_c2(ft), _c2(ft), _U8C, types.boolean, _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), _ro(ft, 1),
                _c2(ft, False), _c2(ft, False)) for ft in _FLOATS],
    parallel=True, fastmath=_FM,
)
def gae_timemajor(rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret):
    """Time-major fused GAE on ``(T, R)`` C-contiguous arrays (the transposes
    of time-major ``(R, T)`` row views): the scan runs over ``t`` and is
    vectorised across a block of batch columns (no transposition); the
    carries of a block (4 arrays of its width) are the only scratch."""
    T, R = rewards.shape
    ft = adv.dtype.type
    # Blocks of _W columns (a 4 KiB page of float32 per step); narrow batches
    # get 4 blocks of at least 64 columns so that they still spread over
    # threads.  Columns are independent: the split never changes a result.
    wb = _W if R >= 4 * _W else max(64, (R + 3) // 4)
    nb = (R + wb - 1) // wb
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        c1 = min(c0 + wb, R)
        w = c1 - c0
        an = np.empty(w, _f8)
        vn = np.empty(w, rewards.dtype)
        gg = np.empty(w, rewards.dtype)
        gl = np.empty(w, _f8)
        for k in range(w):
            an[k] = carry[c0 + k]
            vn[k] = bound[c0 + k]
            gg[k] = gcol[c0 + k]
            gl[k] = _f8(gcol[c0 + k]) * _f8(lcol[c0 + k])
        for j in range(T):
            t = np.uint64(T - 1 - j)
            if has_term:
                for k in range(w):
                    c = np.uint64(c0 + k)
                    v = values[t, c]
                    a = _gstep(rewards[t, c], v, vn[k], term[t, c] != 0, gg[k], gl[k], an[k])
                    o = ft(a)
                    adv[t, c] = o
                    ret[t, c] = o + v
                    an[k] = a
                    vn[k] = v
            else:
                for k in range(w):
                    c = np.uint64(c0 + k)
                    v = values[t, c]
                    a = _f8(rewards[t, c] + gg[k] * vn[k] - v) + gl[k] * an[k]
                    o = ft(a)
                    adv[t, c] = o
                    ret[t, c] = o + v
                    an[k] = a
                    vn[k] = v


@kernel(
    [types.void(_c2(ft), _c2(ft), _c2(ft), _U8A, _U8A, _ro(ft, 1), _ro(ft, 1), _ro(ft, 1),
                _c2(ft, False), _c2(ft, False)) for ft in _FLOATS],
    parallel=True, fastmath=_FM,
)
def gae_timemajor_next(rewards, values, next_values, term, trunc, gcol, lcol, carry, adv, ret):
    """:func:`gae_timemajor` with ``next_values`` and terminations/truncations
    (the correct bootstrap for SB3/CleanRL buffers).  ``term`` and ``trunc``
    are uint8 ``(T, R)`` views of any strides (zero-stride views of 0 when
    absent); the data arrays are C-contiguous."""
    T, R = rewards.shape
    ft = adv.dtype.type
    wb = _W if R >= 4 * _W else max(64, (R + 3) // 4)
    nb = (R + wb - 1) // wb
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        c1 = min(c0 + wb, R)
        w = c1 - c0
        an = np.empty(w, _f8)
        gg = np.empty(w, rewards.dtype)
        gl = np.empty(w, _f8)
        for k in range(w):
            an[k] = carry[c0 + k]
            gg[k] = gcol[c0 + k]
            gl[k] = _f8(gcol[c0 + k]) * _f8(lcol[c0 + k])
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for k in range(w):
                c = np.uint64(c0 + k)
                v = values[t, c]
                e = term[t, c] != 0
                a = _nstep(rewards[t, c], v, next_values[t, c], e, e | (trunc[t, c] != 0), gg[k], gl[k], an[k])
                o = ft(a)
                adv[t, c] = o
                ret[t, c] = o + v
                an[k] = a


@njit(fastmath=_FM, nogil=True, cache=True)
def _ret_pair(r, d, out, i, k, has_term, g0, g1, G0, G1):
    """Discounted returns of rows ``i`` and ``k`` in one loop (two chains, as
    :func:`_gae_pair`; ``k == i`` runs one row as both).  ``G = r`` at a done,
    else ``r + γG``: a select, so a NaN stays inside its episode."""
    T = r.shape[1]
    ft = out.dtype.type
    g0 = _f8(g0)
    g1 = _f8(g1)
    if has_term:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            x0 = _f8(r[i, t])
            x1 = _f8(r[k, t])
            y0 = x0 + g0 * G0
            y1 = x1 + g1 * G1
            G0 = x0 if d[i, t] != 0 else y0
            G1 = x1 if d[k, t] != 0 else y1
            out[i, t] = ft(G0)
            out[k, t] = ft(G1)
    else:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            G0 = _f8(r[i, t]) + g0 * G0
            G1 = _f8(r[k, t]) + g1 * G1
            out[i, t] = ft(G0)
            out[k, t] = ft(G1)


@njit(fastmath=_FM, nogil=True, cache=True)
def _ret_unit(u, rewards, term, has_term, gcol, bound, out):
    # Work unit u: rows 2u and 2u + 1, or the last row as both chains when R is odd.
    i = 2 * np.int64(u)
    k = i + 1 if i + 1 < rewards.shape[0] else i
    _ret_pair(rewards, term, out, i, k, has_term, gcol[i], gcol[k], _f8(bound[i]), _f8(bound[k]))


_RET_FUSED_SIGS = [
    types.void(_ro(ft, 2), _U8A, _B, _ro(ft, 1), _ro(ft, 1), types.Array(ft, 2, "A"))
    for ft in _FLOATS
]


@kernel(_RET_FUSED_SIGS, parallel=True, fastmath=_FM)
def returns_rows_fused(rewards, term, has_term, gcol, bound, out):
    """Batch-major discounted returns with scalar or per-row γ, without mask
    or packing, any strides, rows in pairs (see :func:`_ret_pair`): the
    general kernel's operations without its per-step reads of a broadcast γ
    and a mask.  ``term`` is a uint8 view (nonzero = done), read only when
    ``has_term``."""
    for u in prange((rewards.shape[0] + 1) // 2):
        _ret_unit(np.int64(u), rewards, term, has_term, gcol, bound, out)


@kernel(_RET_FUSED_SIGS, fastmath=_FM)
def returns_rows_fused_1t(rewards, term, has_term, gcol, bound, out):
    """:func:`returns_rows_fused` on the calling thread, for small problems
    (same code, same bits)."""
    for u in range((rewards.shape[0] + 1) // 2):
        _ret_unit(u, rewards, term, has_term, gcol, bound, out)


# ------------------------------------------------------ batch-major, in SIMD lanes
#
# linear_scan and discounted_returns on float32 rows contiguous along time, eight
# rows per vector in blocks of _LANE_STEPS steps (see gae_lanes): each row's
# chain is one lane, so one instruction advances eight chains where the pair
# kernels advance two.  The steps of scan_rows and _ret_pair one for one.
_rowscan_rev = scan_block("scan", True, time_major=False, steps=_LANE_STEPS)
_rowscan_fwd = scan_block("scan", False, time_major=False, steps=_LANE_STEPS)
_rowret_term = scan_block("returns", True, has_term=True, time_major=False, steps=_LANE_STEPS)
_rowret_plain = scan_block("returns", True, has_term=False, time_major=False, steps=_LANE_STEPS)


# Blocks a row holds per 16 steps of lane skew (see _lane_span): lanes
# shifted by 16·k steps leave 7·16·k steps of each row to the one-row steps,
# at most 1/32 of the row's steps.
_LANE_SKEW_BLOCKS = 224
_LANE_SKEW_MAX = 64


@njit(inline="always")
def _lane_span(T, phase, stream):
    """``(h0, nb, tb, nt, sk)`` of rows of ``T`` steps: lane ``q``'s blocks
    start at step ``h0 + q·sk`` (``h0`` is ``phase``, or 0 where the row is
    shorter than ``phase + 16``), ``nb`` of them, ending at step ``tb + q·sk``;
    ``nt`` whether they stream (only blocks that start at ``phase`` are
    aligned for it).  Lane ``q`` runs the steps before ``h0 + q·sk`` and from
    ``tb + q·sk`` one row at a time.

    The skew ``sk`` (a multiple of 16 steps, up to ``_LANE_SKEW_MAX``, less in
    short rows, 0 in the shortest) moves the eight rows' loads of a block
    apart in memory: rows of a power-of-two length lie a multiple of 4 KiB
    apart, so the same step of each falls in one set of the level-1 data
    cache, which holds fewer ways than a block loads lines.  Lanes one line
    apart fall in different sets; lanes further apart ran faster still where
    measured (docs/performance.md).  The skew changes which steps run in
    blocks, not the steps' operations."""
    h0 = phase if phase + _LANE_STEPS <= T else 0
    nb = (T - h0) // _LANE_STEPS
    sk = min(_LANE_SKEW_MAX, _LANE_STEPS * (nb // _LANE_SKEW_BLOCKS))
    nb -= 7 * sk // _LANE_STEPS
    return h0, nb, h0 + _LANE_STEPS * nb, stream and h0 == phase, sk


@kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _B, _ro(_F4T, 1), types.int64, _B, types.Array(_F4T, 2, "A")),
         None],
        parallel=True)
def scan_lanes(a, b, reverse, initial, phase, stream, out):
    """:func:`scan_rows` on float32 rows contiguous along time, eight rows per
    SIMD vector: rows ``0 .. 8·(R // 8) − 1`` (the caller runs the others
    through :func:`scan_rows`).  Each group of 8 rows runs the steps outside
    its blocks one row at a time (:func:`_scan_at`) and its blocks of 16
    steps in the scan's order (:func:`gaescan.kernels._lanes.scan_block`):
    the same operations, so the same bits as :func:`scan_rows`.  ``phase``
    and ``stream``: as in :func:`gae_lanes`, for ``out``."""
    R, T = b.shape
    h0, nb, tb, nt, sk = _lane_span(T, phase, stream)
    for grp in prange(R // 8):
        i0 = grp * 8
        y = np.empty(8, _f8)
        # Lane q's steps before its blocks in the scan's order, and those after.
        for q in range(8):
            head0, head1 = (tb + q * sk, T) if reverse else (0, h0 + q * sk)
            y[q] = _scan_steps(a, b, i0 + q, head0, head1, reverse, _f8(initial[i0 + q]), out)
        for k in range(nb):
            if reverse:
                _rowscan_rev(a, b, b, out, i0, tb - _LANE_STEPS * (k + 1), y, initial, nt, sk)
            else:
                _rowscan_fwd(a, b, b, out, i0, h0 + _LANE_STEPS * k, y, initial, nt, sk)
        for q in range(8):
            tail0, tail1 = (0, h0 + q * sk) if reverse else (tb + q * sk, T)
            _scan_steps(a, b, i0 + q, tail0, tail1, reverse, y[q], out)
        if nt:
            sfence()


@njit(inline="always")
def _scan_steps(a, b, i, lo, hi, reverse, y, out):
    """Steps ``lo .. hi − 1`` of row ``i`` in the scan's order (from ``hi − 1``
    down with ``reverse``), the step of :func:`_scan_at`; returns ``y``."""
    for j in range(hi - lo):
        t = hi - 1 - j if reverse else lo + j
        y = _scan_at(a, b, i, np.uint64(t), y, out)
    return y


@njit(inline="always", fastmath=_FM)
def _ret_tail(r, d, has_term, i, hi, lo, g, G, out):
    """Steps ``hi − 1`` down to ``lo`` of row ``i`` with the step of
    :func:`_ret_pair` (the same bits); returns the carried ``G``."""
    g = _f8(g)
    for t in range(hi - 1, lo - 1, -1):
        x = _f8(r[i, t])
        y = x + g * G
        G = x if _flag_at(d, has_term, i, t) else y
        out[i, t] = np.float32(G)
    return G


@kernel([types.void(_ro(_F4T, 2), _U8A, _B, _ro(_F4T, 1), _ro(_F4T, 1), types.int64, _B,
                    types.Array(_F4T, 2, "A")), None],
        parallel=True, fastmath=_FM)
def returns_lanes(rewards, term, has_term, gcol, bound, phase, stream, out):
    """:func:`returns_rows_fused` on float32 rows contiguous along time
    (``term``, read with ``has_term``, too), eight rows per SIMD vector:
    rows ``0 .. 8·(R // 8) − 1``, as :func:`scan_lanes` runs
    :func:`scan_rows`'s.  The steps of :func:`_ret_pair`, so the same bits."""
    R, T = rewards.shape
    h0, nb, tb, nt, sk = _lane_span(T, phase, stream)
    for grp in prange(R // 8):
        i0 = grp * 8
        G = np.empty(8, _f8)
        g8 = np.empty(8, np.float32)
        for q in range(8):
            g8[q] = gcol[i0 + q]
            G[q] = _ret_tail(rewards, term, has_term, i0 + q, T, tb + q * sk, g8[q], _f8(bound[i0 + q]), out)
        for k in range(nb):
            if has_term:
                _rowret_term(rewards, rewards, term, out, i0, tb - _LANE_STEPS * (k + 1), G, g8, nt, sk)
            else:
                _rowret_plain(rewards, rewards, term, out, i0, tb - _LANE_STEPS * (k + 1), G, g8, nt, sk)
        for q in range(8):
            _ret_tail(rewards, term, has_term, i0 + q, h0 + q * sk, 0, g8[q], G[q], out)
        if nt:
            sfence()
