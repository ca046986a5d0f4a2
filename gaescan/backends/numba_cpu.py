"""The ``"numba"`` backend: Numba CPU kernels on NumPy arrays.

Casting to the kernels' uniform argument kinds happens here (see
:mod:`gaescan.kernels.cpu`); the kernels only loop.

Dispatch for :func:`gae`: the fused fast kernels take every unpacked call
whose γ and λ are scalars or per-row, with terminations, or ``next_values``
with terminations/truncations, or (batch-major only) masks — not masks and
``next_values`` together; time-major row views (time stride ≥ batch stride, all arrays
C-contiguous once transposed) go to the kernel that vectorises across the
batch, everything else to the fused batch-major kernel (any strides; rows in
pairs; below ``SERIAL_MAX_STEPS`` steps on the calling thread).  The rest goes
to the general kernels: per sequence for batch-major and packed rows, sweeping
blocks of batch columns for time-major views (``gae_tm``, ``returns_tm``,
``scan_tm``).  Batch-major :func:`discounted_returns` (scalar or per-row γ,
no mask or packing) and :func:`linear_scan` run their pair kernels, or, on
float32 rows contiguous along time above ``SERIAL_MAX_STEPS``, eight rows
at a time in SIMD lanes (:func:`_scan_lanes_ok`).  A zero decay (γ or λ
zero in a row, γ in a row for returns) drops the carry there, as a done does:
the batch-major pair kernel runs such a GAE row without it; a call with one
takes no lanes, time-major fused or packed kernel (they multiply by the
decay), and returns with a zero γ take the general kernels.

State precision: a float32 output carries its recurrence state in float64
(:mod:`gaescan.kernels.cpu`) unless every decay is known to be far from 1:
γ and λ (GAE), γ (returns) or ``a`` (linear_scan) scalar or per-row, with the
largest ``|γ·λ|`` / ``|γ|`` / ``|a|`` at most ``F32_STATE_MAX_DECAY``.  Those
calls run the kernels' float32-state builds (``Kernel.f32_state``), which
take fewer instructions per step.  GAE's δ uses γ once per step (no
accumulation), so only the decay of the carried advantage, γλ, counts.  The
relative error of a float32 state grows with the horizon ``1/(1 − decay)``:
about as the float32 rounding times its square root for noisy rewards, and
linearly (the worst case) for constant rewards, where ``γ·acc`` rounds the
same way at every step.  At decays up to ``F32_STATE_MAX_DECAY`` it stays
within the contract's float32 tolerance on 2^17-step rows even then
(``tests/test_f32_near_one.py``).  Per-step coefficient arrays
(not inspected per call) and decays closer to 1 keep the float64 state.
float64 outputs always run the float64 builds.

Copies (documented costs, all O(rows) except the last two): per-row
coefficient columns and boundary values; data arrays not already of the
output dtype (float16 / integer inputs) are cast, and flags wider than one
byte (int32/float flags) are compared to 0, each an O(R·T) temporary.
"""

from __future__ import annotations

from math import copysign
from typing import Any

import numba
import numpy as np

from .._problem import Coeff, GAEProblem, ReturnsProblem, Rows, ScanProblem
from ..kernels import cpu

_NO_OFFSETS = np.zeros(1, dtype=np.int64)
_NO_FLAGS = np.zeros((1, 1), dtype=np.uint8)
_ZERO8 = np.zeros(1, dtype=np.uint8)
_ZERO8.flags.writeable = False
_ONE8 = np.ones(1, dtype=np.uint8)
_ONE8.flags.writeable = False
_F4 = np.dtype(np.float32)

#: The largest decay (``|γ·λ|`` for GAE, ``|γ|`` for returns, ``|a|`` for
#: linear_scan) at which a float32 output carries its state in float32: 0.99
#: as float32 (just above 0.99, so that γ = 0.99 is included).  Constant
#: rewards are the worst case: each step rounds ``γ·acc`` the same way and
#: the error grows linearly with the horizon, reaching the contract's float32
#: tolerance a little above this decay.
F32_STATE_MAX_DECAY = float(np.float32(0.99))


def _narrow(rows: Rows, *coeffs: Coeff, cols: tuple | None = None) -> bool:
    """Whether a float32 output may carry its state in float32: each
    coefficient scalar or per-row, and the largest absolute product of the
    coefficients (as the kernels see them, rounded to float32) at most
    ``F32_STATE_MAX_DECAY``.  A NaN coefficient answers ``False``.  ``cols``:
    the coefficients' per-row columns (:func:`_column`), when the caller has them."""
    if rows.dtype != _F4:
        return False
    decay: Any = 1.0
    for k, c in enumerate(coeffs):
        if isinstance(c, float):
            decay = decay * abs(float(np.float32(c)))
            continue
        col = _column(c, rows) if cols is None else cols[k]
        if col is None or col.size == 0:
            return False
        decay = decay * np.abs(col.astype(np.float64))
    return bool(np.max(decay) <= F32_STATE_MAX_DECAY)


def _data(x: Any, rows: Rows) -> np.ndarray:
    return x if x.dtype is rows.dtype else x.astype(rows.dtype, copy=False)


def _coeff(c: Coeff, rows: Rows) -> np.ndarray:
    if isinstance(c, float):
        return np.broadcast_to(rows.dtype.type(c), (rows.R, rows.T))
    return _data(c, rows)


def _flag(x: Any | None, rows: Rows, absent: bool) -> np.ndarray:
    if x is None:
        return np.ndarray((rows.R, rows.T), np.uint8, _ONE8 if absent else _ZERO8, 0, (0, 0))
    return _flag8(x)


def _bound(v: Coeff, rows: Rows) -> np.ndarray:
    if isinstance(v, float):
        return _const_col(v, rows.nseg, rows.dtype)
    return v.astype(rows.dtype, copy=False)


def _offsets(rows: Rows) -> tuple[np.ndarray, bool]:
    if rows.cu_seqlens is None:
        return _NO_OFFSETS, False
    return rows.cu_seqlens, True


def _flag8(x: Any) -> np.ndarray:
    """A flag as uint8 (nonzero = true): a free view for 1-byte flags."""
    if x.dtype.itemsize == 1 and x.dtype.kind in "biu":
        return x.view(np.uint8)
    return (x != 0).view(np.uint8)


def _column(c: Coeff, rows: Rows) -> np.ndarray | None:
    """A scalar or per-row coefficient as a contiguous ``(R,)`` array; ``None``
    when it varies along time."""
    if isinstance(c, float):
        return _const_col(c, rows.R, rows.dtype)
    if rows.T == 1 or c.strides[1] == 0:
        return np.ascontiguousarray(c[:, 0], dtype=rows.dtype)
    return None


# Below this many steps a call runs on the calling thread: waking Numba's
# thread pool costs about 10 µs, more than a serial pass over 32K steps.
SERIAL_MAX_STEPS = 1 << 15

_cols: dict[tuple, np.ndarray] = {}


def _const_col(value: float, n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only ``(n,)`` array of ``value`` (cached: training loops repeat
    the same γ, λ and batch size call after call).  A zero is keyed on its bits,
    so that -0.0 and 0.0 (equal as floats) stay apart."""
    key = (value, n, dtype.char) if value else (value.hex(), n, dtype.char)
    col = _cols.get(key)
    if col is None:
        if len(_cols) > 64:
            _cols.clear()
        col = np.full(n, value, dtype=dtype)
        col.flags.writeable = False
        _cols[key] = col
    return col


def _rows_kernel(R: int, T: int, contiguous: bool = False) -> Any:
    """The batch-major fused kernel for ``R`` rows of ``T`` steps (its build
    for C-contiguous rows with ``contiguous``)."""
    if R * T <= SERIAL_MAX_STEPS:
        return cpu.gae_rows_fused_1t_c if contiguous else cpu.gae_rows_fused_1t
    return cpu.gae_rows_fused_c if contiguous else cpu.gae_rows_fused


def _time_major(*arrays: np.ndarray) -> bool:
    return all(a.T.flags.c_contiguous for a in arrays)


def gae(p: GAEProblem) -> None:
    _gae(p, False)


def gae_kept(p: GAEProblem) -> Any:
    """:func:`gae`, returning a replay of the call (see :mod:`gaescan._kept`)
    when it ran the batch-major fused kernel on arrays it needed no cast for;
    else ``None``."""
    return _gae(p, True)


def _gae(p: GAEProblem, keep: bool) -> Any:
    rows = p.rows
    if rows.cu_seqlens is None and (p.next_values is None or p.mask is None):
        prep = _fused_prep(p, rows)
        if prep is not None and _gae_fast(p, rows, prep):
            return _fused_replay(p, rows, prep) if keep else None
    if rows.cu_seqlens is None or not _gae_packed(p, rows):
        _gae_general(p, rows)
    return None


# The packed-lanes kernel runs sequences of at least this many steps on
# average: shorter ones run mostly one step at a time (the lanes' heads and
# tails), where the general kernel runs two sequences per loop.
PACKED_MIN_MEAN_STEPS = 256
# One lane runs a whole sequence: a sequence that holds more than this
# fraction of the steps is the call's critical path, one step at a time, where
# the general kernel runs it beside the others.  A lane's share of the steps
# with two groups of eight lanes; a fixed fraction, not one per thread count,
# so that the kernel, and with it the bits, never depend on the thread count.
PACKED_MAX_SEQUENCE_SHARE = 1 / 16


def _gae_packed(p: GAEProblem, rows: Rows) -> bool:
    """Packed sequences with scalar γ and λ (both nonzero) through a fused
    kernel; ``False`` (nothing run) for other calls (per-step or zero
    decays, a mask with ``next_values``), which the general kernel runs.

    :func:`gaescan.kernels.cpu.gae_packed_lanes` (eight sequences in SIMD
    lanes) runs float32 calls where it serves (:func:`_packed_lanes_fit` and
    every array contiguous along time),
    :func:`gaescan.kernels.cpu.gae_packed_pairs` (two at a time) float64
    ones.  Other float32 calls (short sequences, few of them, one that holds
    much of the steps) run as fast on the general kernel, which they keep
    (benchmarks/results/*-packed-pairs.txt)."""
    if not (isinstance(p.gamma, float) and isinstance(p.lam, float) and p.gamma and p.lam):
        return False  # per-step or zero decays: the general kernel (the fused ones multiply by the decay)
    has_next = p.next_values is not None
    if has_next and p.mask is not None:
        return False
    lanes = rows.dtype == _F4
    if lanes and not _packed_lanes_fit(p, rows):
        return False  # float32 the pairs kernel does not serve faster than the general one
    r, v = _data(p.rewards, rows), _data(p.values, rows)
    nv = _data(p.next_values, rows) if has_next else v
    term = None if p.terminated is None else _flag8(p.terminated)
    trunc = None if p.truncated is None else _flag8(p.truncated)
    mask = None if p.mask is None else _flag8(p.mask)
    if lanes and not all(_along_time(x) for x in (r, v, nv, term, trunc, mask, p.advantages, p.returns)
                         if x is not None):
        return False
    gcol, lcol = _const_col(p.gamma, 1, rows.dtype), _const_col(p.lam, 1, rows.dtype)
    narrow = _gae_narrow(p, rows, gcol, lcol)
    bound, carry = _bound(p.last_value, rows), _bound(p.last_advantage, rows)
    if lanes:
        order, groups = _packed_order(rows.cu_seqlens, max(1, min(numba.get_num_threads(), rows.nseg // 8)))
        _run(cpu.gae_packed_lanes, narrow)(
            r, v, nv, has_next, _NO_FLAGS if term is None else term, term is not None,
            _NO_FLAGS if trunc is None else trunc, _NO_FLAGS if mask is None else mask, mask is not None,
            gcol, lcol, bound, carry, rows.cu_seqlens, order, groups,
            *_stream(p.advantages, p.returns), p.advantages, p.returns)
        return True
    # Absent flags: zero-stride views of 0 (the step with next values reads both).
    zeros = np.ndarray(r.shape, np.uint8, _ZERO8, 0, (0, 0))
    _run(cpu.gae_packed_pairs, narrow)(
        r, v, nv, has_next, zeros if term is None else term, term is not None, zeros if trunc is None else trunc,
        _NO_FLAGS if mask is None else mask, mask is not None, gcol, lcol, bound, carry, rows.cu_seqlens,
        p.advantages, p.returns)
    return True


def _packed_lanes_fit(p: GAEProblem, rows: Rows) -> bool:
    """Whether a float32 packed call is shaped for
    :func:`gaescan.kernels.cpu.gae_packed_lanes` (read before any array is
    converted): at least 8 sequences, long ones on average
    (``PACKED_MIN_MEAN_STEPS``), none of more than
    ``PACKED_MAX_SEQUENCE_SHARE`` of the steps, above ``SERIAL_MAX_STEPS``
    steps, and ``next_values`` with both flags.  The kernel also needs every
    array it reads with its steps consecutive in memory (the caller checks)."""
    S, N = rows.nseg, rows.T
    if S < 8 or N < PACKED_MIN_MEAN_STEPS * S or N <= SERIAL_MAX_STEPS:
        return False
    if int(np.diff(rows.cu_seqlens).max()) > PACKED_MAX_SEQUENCE_SHARE * N:
        return False
    return p.next_values is None or (p.terminated is not None and p.truncated is not None)


# From this many bytes of each output up, the lanes kernels write the outputs
# by non-temporal stores where their alignment allows (see _stream): at sizes
# beyond the caches, that saves reading each output line before writing it.
# Below, a caller that reads the outputs next finds them in the caches.
STREAM_MIN_BYTES = 8 << 20


def _stream(adv: np.ndarray, ret: np.ndarray) -> tuple[int, bool]:
    """``(phase, stream)`` for float32 outputs contiguous along time: ``phase``
    the first step of row 0 of ``adv`` that starts a 64-byte line, modulo 16
    (0 when its items are not 4-byte aligned); ``stream`` whether the lanes
    kernels may write both outputs by non-temporal stores.  They may where
    each is ``STREAM_MIN_BYTES`` or more, and every row of both starts its
    lines at that same step: rows a multiple of 64 bytes apart, and the two
    outputs' starts too."""
    a = adv.__array_interface__["data"][0]
    phase = (-a // 4) % 16 if a % 4 == 0 else 0
    if adv.nbytes < STREAM_MIN_BYTES or a % 4 or (a - ret.__array_interface__["data"][0]) % 64:
        return phase, False
    if adv.ndim == 2 and adv.shape[0] > 1 and (adv.strides[0] % 64 or ret.strides[0] % 64):
        return phase, False
    return phase, True


def _stream_cols(adv: np.ndarray, ret: np.ndarray) -> tuple[int, bool]:
    """``(phase, stream)`` for time-major float32 outputs (C-contiguous
    ``(T, R)`` transposes): ``phase`` the first column of row 0 of ``adv``
    that starts a 64-byte line (0 when its items are not 4-byte aligned):
    the time-major lanes kernels
    (:func:`gaescan.kernels.cpu.gae_timemajor_lanes` and its siblings) start
    their vectors at ``phase % 8`` and split columns between threads at
    lines; ``stream`` whether they may write both outputs by non-temporal
    stores: each output ``STREAM_MIN_BYTES`` or more, rows a multiple of 32
    bytes long, and both outputs at the same phase (one output: pass it
    twice)."""
    a = adv.__array_interface__["data"][0]
    if a % 4:
        return 0, False
    phase = (-a // 4) % 16
    ok = (adv.nbytes >= STREAM_MIN_BYTES and adv.shape[0] % 8 == 0
          and (a - ret.__array_interface__["data"][0]) % 64 == 0)
    return phase, ok


def _packed_order(cu: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: group ``u`` of :func:`gaescan.kernels.cpu.gae_packed_lanes`
    runs sequences ``order[bounds[u] : bounds[u + 1]]``.  The groups are runs
    of consecutive sequences of about equal steps, at least 8 sequences each
    (``len(cu) − 1 >= 8 * groups``); within each, the longest come first."""
    S = len(cu) - 1
    target = cu[-1] * np.arange(1, groups) / groups
    k = np.searchsorted(cu, target)
    # the nearer of the two sequence boundaries around each target
    k -= (k > 0) & (target - cu[np.maximum(k - 1, 0)] < cu[np.minimum(k, S)] - target)
    bounds = np.concatenate([[0], k, [S]]).astype(np.int64)
    for i in range(1, groups):
        bounds[i] = max(bounds[i], bounds[i - 1] + 8)
    for i in range(groups - 1, 0, -1):
        bounds[i] = min(bounds[i], bounds[i + 1] - 8)
    lengths = np.diff(cu)
    group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(bounds))
    order = np.lexsort((-lengths, group)).astype(np.int64)
    return order, bounds


def _gae_general(p: GAEProblem, rows: Rows) -> None:
    r = _data(p.rewards, rows)
    values = _data(p.values, rows)
    args = [
        r, values, values if p.next_values is None else _data(p.next_values, rows),
        _coeff(p.gamma, rows), _coeff(p.lam, rows),
        _flag(p.terminated, rows, False), _flag(p.truncated, rows, False), _flag(p.mask, rows, True),
    ]
    nv, bound, carry = p.next_values is not None, _bound(p.last_value, rows), _bound(p.last_advantage, rows)
    zero = rows.dtype.type(0)
    narrow = _narrow(rows, p.gamma, p.lam)
    if _sweep_time_major(rows, r):
        _run(cpu.gae_tm, narrow)(*[a.T for a in args], nv, bound, carry, zero, p.advantages.T, p.returns.T)
        return
    cu, packed = _offsets(rows)
    _run(cpu.gae_rows, narrow)(*args, nv, bound, carry, cu, packed, zero, p.advantages, p.returns)


class _Fused:
    """What the fused kernels need besides the arrays: the per-row columns of
    γ and λ, the boundary values, whether the state may be float32
    (``narrow``), the batch-major pair kernel for the call's size
    (:meth:`rows_call`) and ``lanes_call``, the eight-rows-in-lanes kernel
    where it may serve (:func:`_lanes_kernel`; :func:`_call_rows` checks the
    arrays' layout)."""

    __slots__ = ("gcol", "lcol", "bound", "carry", "narrow", "zero", "lanes_call", "_shape", "_calls")

    def __init__(self, gcol: np.ndarray, lcol: np.ndarray, bound: np.ndarray, carry: np.ndarray,
                 narrow: bool, rows: Rows, zero: bool = False):
        self.gcol, self.lcol, self.bound, self.carry, self.narrow = gcol, lcol, bound, carry, narrow
        # A zero decay γλ in a row (``zero``) drops the carry there, as a done
        # does: the pair kernel runs such a row without it; the lanes and
        # time-major kernels multiply by the decay, so they serve no such call.
        self.zero = zero
        self.lanes_call = None if zero else _lanes_kernel(rows, narrow)
        self._shape = rows.R, rows.T, rows.dtype
        self._calls: list[Any] = [None, None]

    def rows_call(self, contiguous: bool) -> Any:
        """The pair kernel ready to call (see
        :meth:`gaescan.kernels.cpu.Kernel.caller`): its build for C-contiguous
        rows with ``contiguous``.  Each is resolved (compiled, for a serial
        kernel) on first use: a call compiles only the build it runs."""
        call = self._calls[contiguous]
        if call is None:
            R, T, dtype = self._shape
            call = self._calls[contiguous] = _rows_kernel(R, T, contiguous).caller(dtype, self.narrow)
        return call


def _lane_rows(rows: Rows) -> bool:
    """Whether rows are shaped for the eight-rows-in-lanes kernels: float32,
    at least 8 of them, above ``SERIAL_MAX_STEPS`` steps (below, the calling
    thread runs the pair kernels)."""
    return rows.dtype == _F4 and rows.R >= 8 and rows.R * rows.T > SERIAL_MAX_STEPS


def _lanes_kernel(rows: Rows, narrow: bool) -> Any:
    """The eight-rows-in-lanes kernel's call for these rows (:func:`_lane_rows`),
    or ``None``."""
    if not _lane_rows(rows):
        return None
    return cpu.gae_lanes.caller(_F4, narrow)


def _along_time(x: np.ndarray) -> bool:
    """Whether ``x``'s steps are consecutive in memory (what the lanes kernel reads)."""
    return x.strides[1] == x.itemsize


# The preparations of calls with scalar γ and λ (nonzero) and the default
# boundaries (0): training loops repeat these call after call.  Keyed on the
# plan's ``Rows`` (one object per call structure, held by the entry so that
# its id stays unique), the two coefficients and the module settings the
# choices depend on.  Other calls prepare per call: a zero coefficient or
# boundary may be -0.0, which equals 0.0 as a key but not in the results' bits.
_PREPS: dict[tuple, tuple[Rows, _Fused]] = {}


def _fused_prep(p: GAEProblem, rows: Rows) -> _Fused | None:
    """The fused kernels' preparation, or ``None`` when γ or λ varies along time."""
    g, lam, lv, la = p.gamma, p.lam, p.last_value, p.last_advantage
    key = None
    if (type(g) is float and type(lam) is float and g and lam and type(lv) is float
            and type(la) is float and lv == 0.0 == la and copysign(1.0, lv) > 0 < copysign(1.0, la)):
        key = (id(rows), g, lam, F32_STATE_MAX_DECAY, SERIAL_MAX_STEPS)
        entry = _PREPS.get(key)
        if entry is not None and entry[0] is rows:
            return entry[1]
    gcol = _column(g, rows)
    lcol = None if gcol is None else _column(lam, rows)
    if lcol is None:
        return None
    zero = key is None and not (gcol.all() and lcol.all())
    prep = _Fused(gcol, lcol, _bound(lv, rows), _bound(la, rows), _gae_narrow(p, rows, gcol, lcol), rows, zero)
    if key is not None:
        if len(_PREPS) >= 64:
            _PREPS.clear()
        _PREPS[key] = (rows, prep)
    return prep


def _run(kernel: cpu.Kernel, narrow: bool) -> Any:
    """The kernel's float32-state call when ``narrow``, else its plain call."""
    return kernel.f32_state if narrow else kernel


# The choice for scalar (γ, λ) pairs: training loops repeat the same pair, and
# rounding both to float32 costs more than a lookup.  NaN keys never match and
# are recomputed (a NaN decay answers False).
_scalar_narrow: dict[tuple[float, float, float], bool] = {}


def _gae_narrow(p: GAEProblem, rows: Rows, gcol: np.ndarray, lcol: np.ndarray) -> bool:
    """:func:`_narrow` for GAE's decay γλ on the fused paths (scalars without
    array work: the small-call path)."""
    if rows.dtype != _F4:
        return False
    if isinstance(p.gamma, float) and isinstance(p.lam, float):
        key = (p.gamma, p.lam, F32_STATE_MAX_DECAY)
        narrow = _scalar_narrow.get(key)
        if narrow is None:
            if len(_scalar_narrow) > 64:
                _scalar_narrow.clear()
            narrow = abs(float(np.float32(p.gamma)) * float(np.float32(p.lam))) <= F32_STATE_MAX_DECAY
            _scalar_narrow[key] = narrow
        return narrow
    if gcol.size == 0:
        return False
    return bool(np.max(np.abs(gcol.astype(np.float64) * lcol)) <= F32_STATE_MAX_DECAY)


def _gae_fast(p: GAEProblem, rows: Rows, prep: _Fused) -> bool:
    """Run a fused kernel; ``False`` when none fits (time-major rows that the
    fused time-major kernels cannot take go to the general sweep instead)."""
    r, v = _data(p.rewards, rows), _data(p.values, rows)
    term = None if p.terminated is None else _flag8(p.terminated)
    mask = None if p.mask is None else _flag8(p.mask)
    if _sweep_time_major(rows, r):
        return not prep.zero and _gae_fast_time_major(p, rows, prep, r, v, term, mask)
    nv = None if p.next_values is None else _data(p.next_values, rows)
    trunc = None if p.truncated is None else _flag8(p.truncated)
    _call_rows(prep, r, v, nv, term, trunc, mask, p.advantages, p.returns)
    return True


def _call_rows(prep: _Fused, r: np.ndarray, v: np.ndarray, nv: np.ndarray | None, term: np.ndarray | None,
               trunc: np.ndarray | None, mask: np.ndarray | None, adv: np.ndarray, ret: np.ndarray,
               contiguous: bool | None = None) -> None:
    """The batch-major fused kernel on prepared arrays (flags as uint8 views
    or ``None``).  With ``next_values`` the kernel reads both flags: absent
    ones as zero-stride views of 0.  Where every array it reads is contiguous
    along time (and, with ``next_values``, both flags are given), the
    eight-rows-in-lanes kernel runs the rows it can and the pair kernel, with
    the same arguments, the last ``R % 8``.  Elsewhere the pair kernel runs
    its build for C-contiguous rows where the arrays it types "C" are (see
    :data:`gaescan.kernels.cpu.gae_rows_fused_c`); ``contiguous``, when not
    ``None``, says whether they are (a replay knows it beforehand)."""
    if nv is None and prep.lanes_call is None:
        # The small calls' path, kept free of the argument tuples below: a
        # replayed call spends most of its host time here.
        if contiguous is None:
            contiguous = (r.flags.c_contiguous and v.flags.c_contiguous and adv.flags.c_contiguous
                          and ret.flags.c_contiguous and (term is None or term.flags.c_contiguous))
        call = prep.rows_call(contiguous)
        call(r, v, v, False, _NO_FLAGS if term is None else term, term is not None, _NO_FLAGS,
             _NO_FLAGS if mask is None else mask, mask is not None, prep.gcol, prep.lcol, prep.bound,
             prep.carry, adv, ret)
        return
    if nv is not None:
        zeros = np.ndarray(r.shape, np.uint8, _ZERO8, 0, (0, 0))
        args = (r, v, nv, True, zeros if term is None else term, term is not None,
                zeros if trunc is None else trunc, _NO_FLAGS, False)
    else:
        args = (r, v, v, False, _NO_FLAGS if term is None else term, term is not None, _NO_FLAGS,
                _NO_FLAGS if mask is None else mask, mask is not None)
    if prep.lanes_call is None:
        if contiguous is None:
            contiguous = all(x.flags.c_contiguous for x in args[:3] + args[4:5] + (adv, ret))
        call = prep.rows_call(contiguous)
        call(*args, prep.gcol, prep.lcol, prep.bound, prep.carry, adv, ret)
        return
    tail = (prep.gcol, prep.lcol, prep.bound, prep.carry, adv, ret)
    read = (r, v, nv, term, trunc, adv, ret) if nv is not None else (
        r, v, adv, ret, r if term is None else term, r if mask is None else mask)
    if not all([x is not None and _along_time(x) for x in read]):
        prep.rows_call(False)(*args, *tail)
        return
    phase, stream = _stream(adv, ret)
    prep.lanes_call(*args, prep.gcol, prep.lcol, prep.bound, prep.carry, phase if stream else 0, stream, adv, ret)
    R = r.shape[0]
    r8 = R - R % 8
    if r8 < R:
        s = slice(r8, None)
        prep.rows_call(False)(*(x[s] if isinstance(x, np.ndarray) and x is not _NO_FLAGS else x for x in args),
                              *(x[s] for x in tail))


def _fused_replay(p: GAEProblem, rows: Rows, prep: _Fused) -> Any:
    """A replay of the batch-major fused call that :func:`_gae_fast` just
    made, for arrays of the same structure: ``None`` for time-major rows,
    data to cast or flags to compare.  The replay allocates the outputs and
    makes the same :func:`_call_rows`; it returns ``None`` once
    ``SERIAL_MAX_STEPS`` or ``F32_STATE_MAX_DECAY`` differs from the values
    its kernel choice read."""
    dtype = rows.dtype
    if _sweep_time_major(rows, p.rewards) or any(
            x is not None and x.dtype is not dtype for x in (p.rewards, p.values, p.next_values)):
        return None
    if any(x is not None and (x.dtype.itemsize != 1 or x.dtype.kind not in "biu")
           for x in (p.terminated, p.truncated, p.mask)):
        return None
    shape, serial_max, max_decay = (rows.R, rows.T), SERIAL_MAX_STEPS, F32_STATE_MAX_DECAY
    u8, empty, call = np.uint8, np.empty, _call_rows
    # The key fixes every input's strides, and the outputs are new C arrays.
    # With next values, an absent termination flag is a zero-stride view.
    contiguous = all(x.flags.c_contiguous for x in (p.rewards, p.values, p.next_values, p.terminated)
                     if x is not None) and (p.next_values is None or p.terminated is not None)

    def replay(r, v, nv, term, trunc, mask):
        if serial_max is not SERIAL_MAX_STEPS or max_decay is not F32_STATE_MAX_DECAY:
            return None
        adv, ret = empty(shape, dtype), empty(shape, dtype)
        call(prep, r, v, nv, None if term is None else term.view(u8), None if trunc is None else trunc.view(u8),
             None if mask is None else mask.view(u8), adv, ret, contiguous)
        return adv, ret

    return replay


def _gae_fast_time_major(p: GAEProblem, rows: Rows, prep: _Fused, r: np.ndarray, v: np.ndarray,
                         term: np.ndarray | None, mask: np.ndarray | None) -> bool:
    adv, ret = p.advantages, p.returns
    if mask is not None or not _time_major(r, v, adv, ret):
        return False
    phase, stream = _stream_cols(adv, ret) if rows.dtype == _F4 else (0, False)
    if p.next_values is not None:
        nv = _data(p.next_values, rows)
        if not _time_major(nv):
            return False
        tr = None if p.truncated is None else _flag8(p.truncated)
        if stream and term is not None and tr is not None and _time_major(term, tr):
            _run(cpu.gae_timemajor_lanes, prep.narrow)(r.T, v.T, nv.T, True, term.T, True, tr.T, prep.gcol, prep.lcol,
                                                       prep.bound, prep.carry, phase, True, numba.get_num_threads(),
                                                       adv.T, ret.T)
            return True
        _run(cpu.gae_timemajor_next, prep.narrow)(r.T, v.T, nv.T, _flag(p.terminated, rows, False).T,
                                                  _flag(p.truncated, rows, False).T, prep.gcol, prep.lcol,
                                                  prep.carry, adv.T, ret.T)
        return True
    if term is not None and not _time_major(term):
        return False
    if stream:
        # Eight columns per vector and non-temporal stores; with ordinary
        # stores that kernel is no faster than the vectorised loops.
        _run(cpu.gae_timemajor_lanes, prep.narrow)(r.T, v.T, r.T, False, _NO_FLAGS if term is None else term.T,
                                                   term is not None, _NO_FLAGS, prep.gcol, prep.lcol, prep.bound,
                                                   prep.carry, phase, True, numba.get_num_threads(), adv.T, ret.T)
        return True
    _run(cpu.gae_timemajor, prep.narrow)(r.T, v.T, _NO_FLAGS if term is None else term.T, term is not None,
                                         prep.gcol, prep.lcol, prep.bound, prep.carry, adv.T, ret.T)
    return True


def discounted_returns(p: ReturnsProblem) -> None:
    rows = p.rows
    r = _data(p.rewards, rows)
    if rows.cu_seqlens is None and p.mask is None and not _sweep_time_major(rows, r):
        gcol = _column(p.gamma, rows)
        if gcol is not None and gcol.all():  # a zero γ: the general kernel (see _fused_prep)
            kernel = cpu.returns_rows_fused_1t if rows.R * rows.T <= SERIAL_MAX_STEPS else cpu.returns_rows_fused
            term = _NO_FLAGS if p.dones is None else _flag8(p.dones)
            narrow = _narrow(rows, p.gamma, cols=(gcol,))
            bound, out = _bound(p.last_value, rows), p.returns
            if _scan_lanes_ok(rows, r, out, *(() if p.dones is None else (term,))):
                # Eight rows at a time in SIMD lanes, the last R % 8 rows in pairs.
                phase, stream = _stream(out, out)
                _run(cpu.returns_lanes, narrow)(r, term, p.dones is not None, gcol, bound, phase if stream else 0,
                                                stream, out)
                r8 = rows.R - rows.R % 8
                if r8 == rows.R:
                    return
                s = slice(r8, None)
                r, gcol, bound, out = r[s], gcol[s], bound[s], out[s]
                term = term if p.dones is None else term[s]
            _run(kernel, narrow)(r, term, p.dones is not None, gcol, bound, out)
            return
    args = [r, _coeff(p.gamma, rows), _flag(p.dones, rows, False), _flag(p.mask, rows, True)]
    bound, zero = _bound(p.last_value, rows), rows.dtype.type(0)
    narrow = _narrow(rows, p.gamma)
    if _sweep_time_major(rows, r):
        out = p.returns
        gcol = _column(p.gamma, rows) if p.mask is None and rows.dtype == _F4 else None
        term = None if p.dones is None else _flag8(p.dones)
        phase, stream = _stream_cols(out, out)
        if gcol is not None and gcol.all() and stream and _time_major(r, out) and (term is None or _time_major(term)):
            # Eight columns per vector and non-temporal stores (see _gae_fast_time_major).
            _run(cpu.returns_timemajor_lanes, narrow)(r.T, _NO_FLAGS if term is None else term.T, term is not None,
                                                      gcol, bound, phase, True, numba.get_num_threads(), out.T)
            return
        _run(cpu.returns_tm, narrow)(*[a.T for a in args], bound, zero, out.T)
        return
    cu, packed = _offsets(rows)
    _run(cpu.returns_rows, narrow)(*args, bound, cu, packed, zero, p.returns)


def linear_scan(p: ScanProblem) -> None:
    rows = p.rows
    a, b = _coeff(p.a, rows), _data(p.b, rows)
    narrow = _narrow(rows, p.a)
    if _sweep_time_major(rows, b):
        phase, stream = _stream_cols(p.out, p.out)
        if rows.dtype == _F4 and stream and _time_major(a, b, p.out):
            # Eight columns per vector and non-temporal stores (see _gae_fast_time_major).
            _run(cpu.scan_timemajor_lanes, narrow)(a.T, b.T, p.reverse, _bound(p.initial, rows), phase, True,
                                                   numba.get_num_threads(), p.out.T)
            return
        _run(cpu.scan_tm, narrow)(a.T, b.T, p.reverse, _bound(p.initial, rows), p.out.T)
        return
    initial, out = _bound(p.initial, rows), p.out
    if _scan_lanes_ok(rows, a, b, out):
        # Eight rows at a time in SIMD lanes, the last R % 8 rows in pairs.
        phase, stream = _stream(out, out)
        _run(cpu.scan_lanes, narrow)(a, b, p.reverse, initial, phase if stream else 0, stream, out)
        r8 = rows.R - rows.R % 8
        if r8 == rows.R:
            return
        a, b, initial, out = a[r8:], b[r8:], initial[r8:], out[r8:]
    _run(cpu.scan_rows, narrow)(a, b, p.reverse, initial, out)


def _scan_lanes_ok(rows: Rows, *arrays: np.ndarray) -> bool:
    """Whether batch-major ``linear_scan`` or ``discounted_returns`` runs eight
    rows at a time in SIMD lanes (:func:`gaescan.kernels.cpu.scan_lanes`,
    :func:`gaescan.kernels.cpu.returns_lanes`): rows shaped for them
    (:func:`_lane_rows`), every array (each given one) contiguous along time."""
    return _lane_rows(rows) and all(_along_time(x) for x in arrays)


def _sweep_time_major(rows: Rows, x: np.ndarray) -> bool:
    """Whether rows are columns of time-major memory (the time stride is the
    larger one): then the kernels sweep the batch at each step."""
    return (rows.cu_seqlens is None and rows.R > 1 and rows.T > 1
            and abs(x.strides[1]) > abs(x.strides[0]))


def warmup(progress: Any = None) -> int:
    """Compile (or load from the disk cache) every kernel build now rather
    than on first use; see :func:`gaescan.kernels.cpu.compile_all`."""
    return cpu.compile_all(progress)
