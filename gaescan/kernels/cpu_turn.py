"""Numba CPU kernels of turn-level GAE (:func:`gaescan.turn_gae`) over ``(R, T)`` rows.

The kernels are lazy :class:`gaescan.kernels.cpu.Kernel` objects (compiled, or
loaded from Numba's disk cache, on first use), one signature per output
dtype, picked by the dtype of the last argument.  :func:`turn_gae_rows` picks
the build for the call: int32 or int64 ids (read in place), rows that are
C-contiguous (whose unit stride lets LLVM vectorise the loops) or of any
strides, with or without a mask (a build without one reads no mask and
tests none).  Data arrays are 2-D of the output dtype, the mask a 2-D uint8
array (nonzero = valid), and γ, λ and ``last_value`` one value per row.
Validation, casting and allocation happen in
:mod:`gaescan.backends.turn_gae_numba`; the kernels only loop.

The kernel is one backward pass per row (rows in parallel, ``prange``), in
blocks of ``_BLK`` tokens.  A block whose valid tokens all carry the current
turn's id (the common case: turns are long) is checked and its rewards are
summed by one vectorised loop; a block that holds a turn boundary is walked
token by token.  Where a turn begins (the next valid token to the left has
another id, or there is none), the turn is closed: ``U_k`` is the value at
its first token, ``A_k = R_k + γ U_{k+1} − U_k + γλ A_{k+1}``, and one
vectorised loop writes ``A_k`` and ``A_k + U_k`` over the turn's span (its
first valid token up to the next turn's), 0 at its masked tokens; the span
was read a moment before and is still in cache.  Where the outputs are
large (the caller's ``stream``), the fill writes the whole 64-byte lines of
each span by non-temporal stores (:func:`~gaescan.kernels._lanes.stream_fill`)
and the lines a span shares with its neighbours by ordinary ones: the
caller does not read the outputs next, a streamed line costs memory one
write and no read for ownership, and a line streamed in parts would cost
more than one through the cache; the same values, so the same bits.  Masked
tokens before a row's first turn are written 0 at the end.  The state (the reward sums,
``U`` and ``A``) is float64 whatever the output dtype; each output is rounded
once, on store.  The walk issues no software prefetches (a prefetching
build of the batch-major kernels is not faster, see
:mod:`gaescan.kernels.cpu`).

A valid token whose id is greater than that of the next valid token breaks
the contract (ids are non-decreasing along time): the kernel sets ``bad[i]``
for that row and goes on, and the caller raises.

These kernels have no float32-state builds.  Each variant is made on first
use; :func:`declare_all` makes every one, so that ``gaescan warmup``
(:func:`gaescan.kernels.cpu.compile_all`) builds them all.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

from . import cpu
from ._lanes import data_address, sfence, stream_fill
from .cpu import Kernel

_FLOATS = (types.float32, types.float64)
_f8 = np.float64


def _kernel(func, signatures, **options) -> Kernel:
    """A lazy :class:`~gaescan.kernels.cpu.Kernel` without a float32-state build."""
    return Kernel(func, signatures, narrow=False, **options)


# Tokens per block of the walk: a block inside a turn is checked and summed
# by one vectorised loop; a block holding a turn boundary is walked token
# by token.
_BLK = 32
# "No position": above every position of a row.
_NONE = np.uint64(1 << 62)


@njit(inline="always")
def _block(r, d, m, has_mask, lo, hi, cur):
    """Over the tokens ``[lo, hi)``: zero if every valid one has the id ``cur``
    (else nonzero), the sum of the valid ones' rewards (float64; a select, so
    a NaN at a masked token is never added) and the first valid position
    (``_NONE`` when none).

    Positions are unsigned here and in the other loops: a signed index gets
    Numba's negative-index wraparound, which stops LLVM vectorising the loop.
    """
    n = cur ^ cur
    s = _f8(0.0)
    first = _NONE
    if has_mask:
        for t in range(np.uint64(lo), np.uint64(hi)):
            keep = m[t] != 0
            n |= (d[t] ^ cur) if keep else (cur ^ cur)
            s += _f8(r[t]) if keep else _f8(0.0)
            first = min(first, t if keep else _NONE)
    else:
        for t in range(np.uint64(lo), np.uint64(hi)):
            n |= d[t] ^ cur
            s += _f8(r[t])
        first = np.uint64(lo)
    return n, s, first


@njit
def _turn_step(rsum, g, gl, u, u_next, a_next):
    """``(A_k, A_k + U_k)`` from the turn's reward sum and ``U_k``, ``U_{k+1}``,
    ``A_{k+1}``.

    A function of its own, compiled without the kernels' ``reassoc`` (which
    lets LLVM vectorise the reward sums): its instructions keep their flags
    when LLVM inlines it, so ``A_k + U_k`` is never simplified algebraically
    (which would make the return finite where ``U_k`` is inf or NaN).
    """
    ak = rsum + g * u_next - u
    if gl != 0:  # a zero decay γλ drops the carry (a select, as at a done)
        ak = ak + gl * a_next
    return ak, ak + u


@njit(inline="always")
def _fill_one(m, has_mask, lo, hi, x, zero, a):
    """``a[lo:hi] = x`` at valid tokens, ``zero`` at masked ones, by ordinary stores."""
    if has_mask:
        for t in range(np.uint64(lo), np.uint64(hi)):
            a[t] = x if m[t] != 0 else zero
    else:
        for t in range(np.uint64(lo), np.uint64(hi)):
            a[t] = x


@njit(inline="always")
def _stream_one(m, has_mask, lo, hi, x, zero, a):
    """:func:`_fill_one` with the whole 64-byte lines inside ``[lo, hi)``
    written by non-temporal stores (two of
    :func:`~gaescan.kernels._lanes.stream_fill` each), the elements before and
    after them by ordinary stores: a line that a span shares with its
    neighbour goes through the cache, so no line reaches memory by parts."""
    n = 32 // a.itemsize
    head = min(hi, lo + ((-(data_address(a) + lo * a.itemsize)) & 63) // a.itemsize)
    _fill_one(m, has_mask, lo, head, x, zero, a)
    t = head
    while t + 2 * n <= hi:
        if has_mask:
            stream_fill(a, t, x, m)
            stream_fill(a, t + n, x, m)
        else:
            stream_fill(a, t, x, None)
            stream_fill(a, t + n, x, None)
        t += 2 * n
    _fill_one(m, has_mask, t, hi, x, zero, a)


@njit(inline="always")
def _fill(m, has_mask, lo, hi, av, rv, zero, a, rt, stream):
    """``a[lo:hi] = av`` and ``rt[lo:hi] = rv`` at valid tokens, ``zero`` at
    masked ones; with ``stream``, whole lines by non-temporal stores."""
    if stream:
        _stream_one(m, has_mask, lo, hi, av, zero, a)
        _stream_one(m, has_mask, lo, hi, rv, zero, rt)
    else:
        _fill_one(m, has_mask, lo, hi, av, zero, a)
        _fill_one(m, has_mask, lo, hi, rv, zero, rt)


@njit(inline="always")
def _close(v, m, has_mask, lo, hi, rsum, g, gl, a_next, u_next, zero, a, rt, stream):
    """Close the turn whose first valid token is ``lo`` and whose valid rewards
    sum to ``rsum``; its span runs up to the next turn's first valid token
    ``hi`` (exclusive).  Writes the span's outputs and returns ``(A_k, U_k)``."""
    u = _f8(v[np.uint64(lo)])
    ak, rk = _turn_step(rsum, g, gl, u, u_next, a_next)
    _fill(m, has_mask, lo, hi, a.dtype.type(ak), rt.dtype.type(rk), zero, a, rt, stream)
    return ak, u


def _turn_gae_rows(rewards, values, ids, mask, gamma, lam, bound, bad, stream, zero, adv, ret):
    """Turn-level GAE per row.

    Parameters
    ----------
    rewards, values : 2-D float arrays
        ``r_t`` and ``V_t``, of the output dtype.
    ids : 2-D int32 or int64 array
        Turn ids, read at valid tokens only.
    mask : 2-D uint8 array
        Nonzero at valid tokens; read only by the masked builds (``_MASKED``
        true), the others take every token as valid.
    gamma, lam, bound : 1-D float arrays
        γ, λ and ``last_value`` of each row.
    bad : 1-D uint8 array
        Set to 1 for each row whose ids decrease along time at valid tokens.
    stream : bool
        Write the whole 64-byte lines of the turns' spans by non-temporal
        stores (rows contiguous along time only: the caller checks).
    zero : float
        0 of the output dtype.
    adv, ret : 2-D float arrays
        The outputs; every element is written.
    """
    has_mask = _MASKED
    R, T = rewards.shape
    for i in prange(R):
        r = rewards[i]
        v = values[i]
        d = ids[i]
        m = mask[i] if has_mask else mask[0]
        a = adv[i]
        rt = ret[i]
        g = _f8(gamma[i])
        gl = g * _f8(lam[i])
        a_next = _f8(0.0)
        u_next = _f8(bound[i])
        found = False
        cur = d[np.uint64(0)]
        rsum = _f8(0.0)
        lo = np.int64(T)  # the first valid token of the turn being walked
        hi = np.int64(T)  # the end of its span: the next turn's first valid token
        top = np.int64(T)  # the tokens [0, top) are still to walk
        while top > 0:
            bot = max(top - _BLK, np.int64(0))
            if found:
                n, s, first = _block(r, d, m, has_mask, bot, top, cur)
                if n == 0:
                    # The block lies inside the current turn (or is all masked).
                    rsum += s
                    lo = min(lo, np.int64(first))
                    top = bot
                    continue
            for j in range(top - bot):
                t = np.uint64(top - 1 - j)
                if has_mask and not m[t]:
                    continue
                k = d[t]
                if found and k != cur:
                    if k > cur:
                        bad[i] = 1
                    a_next, u_next = _close(v, m, has_mask, lo, hi, rsum, g, gl, a_next, u_next, zero, a, rt, stream)
                    hi = lo
                    rsum = _f8(0.0)
                cur = k
                found = True
                lo = np.int64(t)
                rsum += _f8(r[t])
            top = bot
        if found:
            _close(v, m, has_mask, lo, hi, rsum, g, gl, a_next, u_next, zero, a, rt, stream)
            hi = lo
        for t in range(np.uint64(hi)):
            a[t] = zero
            rt[t] = zero
        if stream:
            sfence()


def _ro(dtype: types.Type, ndim: int, layout: str = "A") -> types.Array:
    return types.Array(dtype, ndim, layout, readonly=True)


def _sigs(id_type: types.Type, layout: str) -> list:
    out = []
    for ft in _FLOATS:
        data = _ro(ft, 2, layout)
        col = _ro(ft, 1)
        res = types.Array(ft, 2, layout)
        out.append(types.void(data, data, _ro(id_type, 2, layout), _ro(types.uint8, 2, layout),
                              col, col, col, types.Array(types.uint8, 1, "C"), types.boolean, ft, res, res))
    return out


# Whether the build reads the mask: a global, so that each build is compiled
# for one case and its loops carry no test of it.  Each build resolves it in
# a namespace of its own (see :func:`_build`).
_MASKED = True
# Reassociation lets LLVM vectorise the blocks' float64 sums; the order of
# each build's sums is fixed, so results stay deterministic.
_FM = {"reassoc", "contract"}
_BUILDS: dict[tuple[str, str, bool], Kernel] = {}


def _build(ids: str, layout: str, masked: bool) -> Kernel:
    """The kernel for int32 (``"i4"``) or int64 (``"i8"``) ids, rows of layout
    ``"C"`` (C-contiguous: the unit stride lets LLVM vectorise each turn's
    sum and fill) or ``"A"`` (any strides), with or without a mask.

    Each one is a copy of :func:`_turn_gae_rows` under its own name (Numba's
    disk cache keys an entry on the function's name, see ``cpu._renamed``),
    made on first use and compiled on its first call.
    """
    key = (ids, layout, masked)
    k = _BUILDS.get(key)
    if k is not None:
        return k
    with cpu._COMPILE_LOCK:
        k = _BUILDS.get(key)
        if k is not None:
            return k
        suffix = f"_{ids}_{layout.lower()}{'_m' if masked else ''}"
        namespace = dict(globals(), _MASKED=masked)
        id_type = types.int32 if ids == "i4" else types.int64
        k = _BUILDS[key] = _kernel(cpu._renamed(_turn_gae_rows, suffix, namespace), _sigs(id_type, layout),
                                   parallel=True, fastmath=_FM)
        return k


def declare_all() -> None:
    """Make every variant (compiling nothing): see :func:`gaescan.kernels.cpu.all_kernels`."""
    for ids in ("i4", "i8"):
        for layout in ("C", "A"):
            for masked in (False, True):
                _build(ids, layout, masked)


def turn_gae_rows(ids: np.dtype, contiguous: bool, masked: bool) -> Kernel:
    """The kernel for ``ids`` of dtype int32 or int64, C-contiguous rows or not, with or without a mask."""
    return _build("i4" if ids == np.int32 else "i8", "C" if contiguous else "A", masked)
