"""Numba CPU kernels of V-trace over ``(R, T)`` rows.

The kernels are lazy :class:`gaescan.kernels.cpu.Kernel` objects (compiled,
or loaded from Numba's disk cache, on first use), one signature per output
dtype, picked by the dtype of the last argument.  They take the argument
kinds of the general GAE kernels (:mod:`gaescan.kernels.cpu`): data and
coefficients as 2-D arrays of the output dtype with any strides (scalar and
per-row coefficients as zero-stride views), flags as 2-D uint8 arrays
(nonzero = true; absent flags and masks as zero-stride views of 0 and 1),
``bound`` one ``last_value`` per sequence, ``cu`` the packed offsets (read
when ``packed``).  Validation, casting and allocation happen in
:mod:`gaescan.backends.vtrace_numba`.

:func:`vtrace_rows` (every feature: masks, packing, per-step γ and λ, any
strides) is one fused backward pass per sequence: the weights ρ, c and ρpg,
δ, the trace ``D`` and both outputs are computed on the fly at each step and
each output element is written once.  :func:`vtrace_fused` (the common case:
C-contiguous rows, scalar or per-row γ and λ, no mask, no packing) computes
every term that does not meet the carry over a tile of steps in a vectorised
loop, runs the carry's chain alone, then writes both outputs in a vectorised
loop (see "fast path" below).  Both run sequences
in pairs (two independent chains in one loop hide each other's latency),
pairs in parallel (``prange``).  The exponential is computed inline
(:func:`_exp`, no library call), so that the elementwise loops vectorise.
The state (``D``) and every product that meets it are float64 whatever the output dtype (a float32 state drifts for decays
near 1, see the contract's accuracy section); each output is rounded to the
output dtype once, on store.  Every ``(1 − flag)`` of the contract is a
select, so a NaN or inf beyond an episode end never reaches it.

These kernels have no float32-state builds (``narrow=False``).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ._lanes import log_ratios_outside, sfence, vtrace_lanes_block
from .cpu import _CU, Kernel, _flag_at, _lane_span, _pair, _ro

_FLOATS = (types.float32, types.float64)
_f8 = np.float64
_FM = {"contract"}


def _kernel(signatures, **options):
    """Decorator: a lazy :class:`~gaescan.kernels.cpu.Kernel` without a float32-state build."""
    return lambda func: Kernel(func, signatures, narrow=False, **options)


# exp(x) in float64 without a library call, so that the step loops stay free
# of calls (and the elementwise loops vectorise): x = k·ln2 + r with |r| <= ln2/2,
# e^r by its Taylor polynomial to r^12 (truncation below 2e-16 relative) in
# Estrin's form (a short dependency chain), k rounded by adding 1.5·2^52 (so
# that k's bits are read without a float-to-integer conversion, which AVX2
# lacks for vectors), 2^k as the product of two powers of two built from their exponent bits
# (each within the float64 normal range, so their product spans the subnormals and the top).
# NaN, ±inf and the overflow and underflow ends are selects.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 rounded to 32 significant bits: k·_LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10  # ln 2 − _LN2_HI
_EXP_MAX = 709.782712893384  # above it e^x overflows float64
_SHIFT = 6755399441055744.0  # 1.5·2^52: x + _SHIFT rounds x to an integer in the low bits


@intrinsic
def _as_f8(typingctx, bits):
    """The float64 whose bits are the int64 ``bits``."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _bits(typingctx, x):
    """The int64 whose bits are the float64 ``x``."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@njit(inline="always", fastmath=_FM)
def _exp(x):
    xc = min(max(x, -745.5), 709.9)
    t = xc * _LOG2E + _SHIFT
    k = t - _SHIFT
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    s0 = (1.0 + r) + (0.5 + r * (1.0 / 6.0)) * r2
    s1 = (1.0 / 24.0 + r * (1.0 / 120.0)) + (1.0 / 720.0 + r * (1.0 / 5040.0)) * r2
    s2 = (1.0 / 40320.0 + r * (1.0 / 362880.0)) + (1.0 / 3628800.0 + r * (1.0 / 39916800.0)) * r2
    p = s0 + (s1 + (s2 + (1.0 / 479001600.0) * r4) * r4) * r4
    ki = _bits(t) - _bits(_SHIFT)
    h = ki >> 1
    y = (p * _as_f8((h + 1023) << 52)) * _as_f8((ki - h + 1023) << 52)
    if x > _EXP_MAX:
        y = math.inf
    if x != x:
        y = x
    return y


@njit(inline="always", fastmath=_FM)
def _clip(bar, x):
    # min(bar, x) keeping a NaN x: a NaN log-ratio must reach its outputs.
    return bar if bar < x else x


@njit(inline="always", fastmath=_FM)
def _core(rt, vt, lrt, vp, g, lam, tm, dn, rb, cb, pb, d_next):
    """One V-trace step on values (the loops load and store: arrays passed into
    a helper in a loop would cost reference counting at every step).  Returns
    the new ``D``, the step's ``vs`` and its advantage."""
    e = _exp(lrt)
    # Selects, not multiplications by (1 - flag).
    td = rt - vt if tm else rt + g * vp - vt
    delta = _clip(rb, e) * td
    # A zero decay (γ or λ zero, or e underflowing) drops the carry as a done does;
    # a zero γ or λ whatever e (times an infinite e it is no NaN).
    decay = 0.0 if g == 0 or lam == 0 else g * (lam * _clip(cb, e))
    dt = delta if dn or decay == 0 else delta + decay * d_next
    vsp = vp if dn else vp + d_next
    a = _clip(pb, e) * (rt - vt if tm else rt + g * vsp - vt)
    return dt, vt + dt, a


@njit(inline="always")
def _next_or(next_values, has_next, i, u, vn):
    """``next_values[i, u]`` with ``has_next``, else ``vn``, read outside any
    branch (see :func:`gaescan.kernels.cpu._flag_at`): ``next_values`` is a
    full array either way."""
    x = next_values[i, u]
    return x if has_next else vn


@njit(inline="always", fastmath=_FM)
def _span(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask, has_next, rb, cb, pb,
          i, e, j0, j1, dn, vn, zero, vs, adv):
    ft = vs.dtype.type
    for j in range(j0, j1):
        u = np.uint64(e - 1 - j)
        if mask[i, u]:
            tm = term[i, u] != 0
            vt = values[i, u]
            dn, o, q = _core(_f8(rewards[i, u]), _f8(vt), _f8(log_rhos[i, u]),
                             _f8(_next_or(next_values, has_next, i, u, vn)), _f8(gamma[i, u]),
                             _f8(lam[i, u]), tm, tm | (trunc[i, u] != 0), rb, cb, pb, dn)
            vs[i, u] = ft(o)
            adv[i, u] = ft(q)
            vn = vt
        else:
            vs[i, u] = zero
            adv[i, u] = zero
    return dn, vn


@njit(inline="always", fastmath=_FM)
def _span2(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask, has_next, rb, cb, pb,
           i0, e0, i1, e1, j1, d0, v0, d1, v1, zero, vs, adv):
    ft = vs.dtype.type
    for j in range(j1):
        u = np.uint64(e0 - 1 - j)
        if mask[i0, u]:
            tm = term[i0, u] != 0
            vt = values[i0, u]
            d0, o, q = _core(_f8(rewards[i0, u]), _f8(vt), _f8(log_rhos[i0, u]),
                             _f8(_next_or(next_values, has_next, i0, u, v0)), _f8(gamma[i0, u]),
                             _f8(lam[i0, u]), tm, tm | (trunc[i0, u] != 0), rb, cb, pb, d0)
            vs[i0, u] = ft(o)
            adv[i0, u] = ft(q)
            v0 = vt
        else:
            vs[i0, u] = zero
            adv[i0, u] = zero
        u = np.uint64(e1 - 1 - j)
        if mask[i1, u]:
            tm = term[i1, u] != 0
            vt = values[i1, u]
            d1, o, q = _core(_f8(rewards[i1, u]), _f8(vt), _f8(log_rhos[i1, u]),
                             _f8(_next_or(next_values, has_next, i1, u, v1)), _f8(gamma[i1, u]),
                             _f8(lam[i1, u]), tm, tm | (trunc[i1, u] != 0), rb, cb, pb, d1)
            vs[i1, u] = ft(o)
            adv[i1, u] = ft(q)
            v1 = vt
        else:
            vs[i1, u] = zero
            adv[i1, u] = zero
    return d0, v0, d1, v1


def _sigs() -> list:
    out = []
    for ft in _FLOATS:
        data = _ro(ft, 2)
        flag = _ro(types.uint8, 2)
        res = types.Array(ft, 2, "A")
        f8 = types.float64
        out.append(types.void(data, data, data, data, data, data, flag, flag, flag, types.boolean,
                              f8, f8, f8, _ro(ft, 1), _ro(ft, 1), _CU, types.boolean, ft, res, res))
    return out


@_kernel(_sigs(), parallel=True, fastmath=_FM)
def vtrace_rows(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask, has_next,
                 rb, cb, pb, bound, carry, cu, packed, zero, vs, adv):
    """V-trace per sequence, sequences in pairs (rows ``2u``, ``2u + 1`` or the
    packed segments ``2u``, ``2u + 1``).

    ``V'_t`` is ``next_values[r, t]`` when ``has_next``, else the value at the
    next unmasked position, else ``bound[s]`` (``last_value``); ``D`` past a
    sequence's end is ``carry[s]`` (``last_trace``).  ``rb``, ``cb``, ``pb`` are the clipping thresholds
    of ρ, c and ρpg (float64).
    """
    n = bound.shape[0]
    for u in prange((n + 1) // 2):
        two, i0, e0, b0, i1, e1, b1 = _pair(u, n, rewards.shape[1], cu, packed)
        s0 = 2 * np.int64(u)
        s1 = s0 + 1 if two else s0
        d0 = _f8(carry[s0])
        d1 = _f8(carry[s1])
        v0 = bound[s0]
        v1 = bound[s1]
        n0 = e0 - b0
        n1 = e1 - b1
        m = min(n0, n1)
        if m > 0:
            d0, v0, d1, v1 = _span2(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask,
                                    has_next, rb, cb, pb, i0, e0, i1, e1, m, d0, v0, d1, v1, zero,
                                    vs, adv)
        if n0 > m:
            _span(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask, has_next, rb, cb, pb,
                  i0, e0, m, n0, d0, v0, zero, vs, adv)
        elif n1 > m:
            _span(rewards, values, log_rhos, next_values, gamma, lam, term, trunc, mask, has_next, rb, cb, pb,
                  i1, e1, m, n1, d1, v1, zero, vs, adv)




# --------------------------------------------------------------------------- fast path
#
# Batch-major C-contiguous rows, scalar or per-row γ and λ, no mask and no
# packing: the common case.  A row runs backwards in tiles of ``_L`` steps,
# three passes per tile:
#
# 1. ascending and vectorised (the exp above has no call): every term that
#    does not meet the carry, into float64 scratch: δ_t, the carry's weight
#    γλc_t (0 at a done), the advantage's bracket w_t, ρpg_t and the carry's
#    mask (0.0 at a done, else 1.0);
# 2. descending, the only loop-carried chain, two rows interleaved:
#    ``D_t = δ_t + γλc_t · (D_{t+1} if γλc_t != 0 else 0)``, one select and one
#    FMA per step (the weight is 0 at a done: a done or a zero decay drops the carry);
# 3. ascending and vectorised: both outputs from the scratch.
#
# Each input element is read from memory once and each output written once.
# Tiles are long so that passes 1 and 3 stream memory upwards in long runs,
# which hardware prefetchers follow, although the walk over tiles descends.
# The select keeps a NaN or inf beyond an episode end out of its episode.

_L = 2048


@njit(inline="always", fastmath=_FM)
def _pre(e, rt, vt, vp, tm, dn, g, gl, rb, cb, pb):
    # One step's terms that do not meet the carry: δ, the carry's weight
    # (0 at a done), the bracket of the advantage, ρpg and the carry's mask.
    w = rt - vt if tm else rt + g * vp - vt
    rho = rb if rb < e else e
    a = 0.0 if gl == 0 else gl * (cb if cb < e else e)
    pg = pb if pb < e else e
    return rho * w, (0.0 if dn else a), w, pg, (0.0 if dn else 1.0)


@njit(inline="always", fastmath=_FM)
def _terms_next(r, lr, v, nv, d, tr, i, lo, n, g, gl, rb, cb, pb, sc):
    for s in range(n):
        t = np.uint64(lo + s)
        tm = d[i, t] != 0
        dn = tm | (tr[i, t] != 0)
        sc[0, s], sc[1, s], sc[2, s], sc[3, s], sc[4, s] = _pre(_exp(_f8(lr[i, t])), _f8(r[i, t]), _f8(v[i, t]),
                                                 _f8(nv[i, t]), tm, dn, g, gl, rb, cb, pb)


@njit(inline="always", fastmath=_FM)
def _terms_shift(r, lr, v, d, has_term, i, lo, n, vlast, g, gl, rb, cb, pb, sc):
    # V'_t is the row's next value: v[t + 1] inside the tile, vlast after it.
    for s in range(n - 1):
        t = np.uint64(lo + s)
        tm = _flag_at(d, has_term, i, t)
        sc[0, s], sc[1, s], sc[2, s], sc[3, s], sc[4, s] = _pre(_exp(_f8(lr[i, t])), _f8(r[i, t]), _f8(v[i, t]),
                                                 _f8(v[i, t + np.uint64(1)]), tm, tm, g, gl, rb, cb, pb)
    s = n - 1
    t = np.uint64(lo + s)
    tm = _flag_at(d, has_term, i, t)
    sc[0, s], sc[1, s], sc[2, s], sc[3, s], sc[4, s] = _pre(_exp(_f8(lr[i, t])), _f8(r[i, t]), _f8(v[i, t]), vlast,
                                             tm, tm, g, gl, rb, cb, pb)


@njit(inline="always", fastmath=_FM)
def _terms(r, lr, v, nv, has_next, d, has_term, tr, i, lo, n, vlast, g, gl, rb, cb, pb, sc):
    if has_next:
        _terms_next(r, lr, v, nv, d, tr, i, lo, n, g, gl, rb, cb, pb, sc)
    elif has_term:
        _terms_shift(r, lr, v, d, True, i, lo, n, vlast, g, gl, rb, cb, pb, sc)
    else:
        _terms_shift(r, lr, v, d, False, i, lo, n, vlast, g, gl, rb, cb, pb, sc)


@njit(inline="always", fastmath=_FM)
def _emit(v, i, lo, n, g, sc, vs, adv):
    ft = vs.dtype.type
    for s in range(n):
        t = np.uint64(lo + s)
        xm = sc[5, s + 1] if sc[4, s] != 0.0 else 0.0
        vs[i, t] = ft(_f8(v[i, t]) + sc[5, s])
        adv[i, t] = ft(sc[3, s] * (sc[2, s] + g * xm))


@njit(fastmath=_FM, nogil=True, cache=True)
def _fused_unit(u, r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv):
    # Work unit u: rows 2u and 2u + 1, or the last row alone when R is odd.
    R, T = r.shape
    i = 2 * np.int64(u)
    k = i + 1 if i + 1 < R else i
    two = k != i
    g0 = _f8(gcol[i])
    g1 = _f8(gcol[k])
    gl0 = g0 * _f8(lcol[i])
    gl1 = g1 * _f8(lcol[k])
    sc0 = np.empty((6, _L + 1), _f8)
    sc1 = np.empty((6, _L + 1), _f8)
    x0 = _f8(carry[i])
    x1 = _f8(carry[k])
    vl0 = _f8(bound[i])
    vl1 = _f8(bound[k])
    hi = np.int64(T)
    while hi > 0:
        lo = max(hi - _L, 0)
        n = hi - lo
        _terms(r, lr, v, nv, has_next, d, has_term, tr, i, lo, n, vl0, g0, gl0, rb, cb, pb, sc0)
        sc0[5, n] = x0
        if two:
            _terms(r, lr, v, nv, has_next, d, has_term, tr, k, lo, n, vl1, g1, gl1, rb, cb, pb, sc1)
            sc1[5, n] = x1
            # The only loop-carried chain, two rows interleaved.
            for s in range(n - 1, -1, -1):
                x0 = sc0[0, s] + sc0[1, s] * (x0 if sc0[1, s] != 0.0 else 0.0)
                sc0[5, s] = x0
                x1 = sc1[0, s] + sc1[1, s] * (x1 if sc1[1, s] != 0.0 else 0.0)
                sc1[5, s] = x1
            _emit(v, k, lo, n, g1, sc1, vs, adv)
            vl1 = _f8(v[k, np.uint64(lo)])
        else:
            for s in range(n - 1, -1, -1):
                x0 = sc0[0, s] + sc0[1, s] * (x0 if sc0[1, s] != 0.0 else 0.0)
                sc0[5, s] = x0
        _emit(v, i, lo, n, g0, sc0, vs, adv)
        vl0 = _f8(v[i, np.uint64(lo)])
        hi = lo


def _fused_sigs() -> list:
    out = []
    for ft in _FLOATS:
        data = types.Array(ft, 2, "C", readonly=True)
        flag = _ro(types.uint8, 2)
        col = _ro(ft, 1)
        res = types.Array(ft, 2, "C")
        f8, b = types.float64, types.boolean
        out.append(types.void(data, data, data, data, b, flag, b, flag, col, col, col, col, f8, f8, f8, res, res))
    return out


@_kernel(_fused_sigs(), parallel=True, fastmath=_FM)
def vtrace_fused(r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv):
    """Fused V-trace on C-contiguous batch-major rows, scalar or per-row γ/λ
    (``gcol``, ``lcol``, one per row), ``bound`` and ``carry`` (``last_value`` and
    ``last_trace``, one per row), terminations (``d``, read when
    ``has_term``) or ``next_values`` with terminations and truncations (``d``
    and ``tr`` both read, zero-stride views of 0 when absent); no mask, no
    packing.  Rows in pairs, pairs in parallel."""
    for u in prange((r.shape[0] + 1) // 2):
        # prange's index is unsigned, range's (the serial build) signed: one type
        # for both lets them share _fused_unit's compiled (and cached) code.
        _fused_unit(np.int64(u), r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv)


# --------------------------------------------------------------------------- eight rows in SIMD lanes
#
# Float32 batch-major rows contiguous along time, plain, with terminations or
# with next_values, scalar or per-row γ and λ: eight rows per SIMD register in
# blocks of 16 steps (:func:`gaescan.kernels._lanes.vtrace_lanes_block`), with no
# scratch: the terms, the exponential, the chain and both outputs of a block
# stay in registers.  A block whose log-ratios all lie in [-87, 88] computes
# the exponential (within one float32 ulp), the bracket and the advantage in
# float32 and only δ, the decay and the trace in float64 (or float32, see
# ``state32``): float64 operations bound the kernel on CPUs that split 256-bit
# operations.  Its results are within the contract's tolerance of
# vtrace_fused's, not the same bits.  Large outputs are written as GAE's lanes
# kernels write theirs: blocks from the outputs' first 64-byte line, by
# non-temporal stores (see vtrace_lanes).  Time-major arrays take the same
# terms in 4-step blocks (vtrace_timemajor_lanes).

_LANE_STEPS = 16
_vlanes_term = vtrace_lanes_block(True, _LANE_STEPS)
_vlanes_plain = vtrace_lanes_block(False, _LANE_STEPS)
# Time-major blocks run 4 steps, the caller checking the log-ratios' range over each
# 16-step span (``checked``): the bits of the batch-major 16-step blocks.
_TM_STEPS = 4
_vlanes_tm_term = vtrace_lanes_block(True, _TM_STEPS, time_major=True, checked=True)
_vlanes_tm_plain = vtrace_lanes_block(False, _TM_STEPS, time_major=True, checked=True)
_vlanes_next = vtrace_lanes_block(True, _LANE_STEPS, has_next=True)
# The same blocks with the trace carried in float32 (``state32``: the
# backend's choice where the decay allows it, see vtrace_lanes).
_vlanes32_term = vtrace_lanes_block(True, _LANE_STEPS, state32=True)
_vlanes32_plain = vtrace_lanes_block(False, _LANE_STEPS, state32=True)
_vlanes32_tm_term = vtrace_lanes_block(True, _TM_STEPS, time_major=True, state32=True, checked=True)
_vlanes32_tm_plain = vtrace_lanes_block(False, _TM_STEPS, time_major=True, state32=True, checked=True)
_tm_outside = log_ratios_outside(_LANE_STEPS)
_vlanes32_next = vtrace_lanes_block(True, _LANE_STEPS, has_next=True, state32=True)
_F4T = types.float32


@njit(inline="always", fastmath=_FM)
def _step(rt, vt, lrt, tm, g, gl, vn, x, rb, cb, pb):
    """One step without next values, the operations of :func:`vtrace_fused`:
    ``(D, vs, advantage)`` from the trace ``x`` and the value ``vn`` after it
    (``tm``: a termination, which takes no bootstrap and no carry)."""
    e = _exp(lrt)
    w = rt - vt if tm else g * vn + rt - vt
    cw = 0.0 if tm or gl == 0 else gl * _clip(cb, e)
    xm = 0.0 if tm else x
    a = _clip(pb, e) * (g * xm + w)
    # The chain's carry: dropped at a zero decay (a done's, or γλ·c = 0), as at a done.
    x = cw * (xm if cw != 0 else 0.0) + _clip(rb, e) * w
    return x, vt + x, a


@njit(inline="always", fastmath=_FM)
def _row_steps(r, v, lr, nv, has_next, d, has_term, tr, g, lam, i, hi, lo, x, vn, rb, cb, pb, vs, adv):
    """Steps ``hi - 1`` down to ``lo`` of row ``i``, one at a time (the
    operations of :func:`vtrace_fused`, so its bits), from the trace ``x`` and
    the value ``vn`` after them; returns the two after step ``lo``."""
    gl = g * lam
    for t in range(hi - 1, lo - 1, -1):
        vt = _f8(v[i, t])
        if has_next:
            tm = d[i, t] != 0
            x, o, a = _core(_f8(r[i, t]), vt, _f8(lr[i, t]), _f8(nv[i, t]), g, lam, tm, tm | (tr[i, t] != 0),
                            rb, cb, pb, x)
        else:
            x, o, a = _step(_f8(r[i, t]), vt, _f8(lr[i, t]), _flag_at(d, has_term, i, t), g, gl, vn, x, rb, cb, pb)
        vs[i, t] = np.float32(o)
        adv[i, t] = np.float32(a)
        vn = vt
    return x, vn


@njit(inline="always", fastmath=_FM)
def _lane_group_tails(r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv,
                      i0, tb, sk):
    """Steps ``tb + q·sk`` to the end of rows ``i0 + q`` (``q`` < 8), one row at a time
    (:func:`_row_steps`), and the blocks' state after them: the trace, the
    value after the step, γ and γλ of each row."""
    T = r.shape[1]
    sx = np.empty(8, _f8)
    sv = np.empty(8, _f8)
    g8 = np.empty(8, _f8)
    gl8 = np.empty(8, _f8)
    for q in range(8):
        i = i0 + q
        g = _f8(gcol[i])
        lam = _f8(lcol[i])
        sx[q], sv[q] = _row_steps(r, v, lr, nv, has_next, d, has_term, tr, g, lam, i, T, tb + q * sk, _f8(carry[i]),
                                  _f8(bound[i]), rb, cb, pb, vs, adv)
        g8[q] = g
        gl8[q] = g * lam
    return sx, sv, g8, gl8


@njit(inline="always", fastmath=_FM)
def _lane_group_heads(r, v, lr, nv, has_next, d, has_term, tr, lcol, rb, cb, pb, vs, adv, i0, h0, sk, sx, sv,
                      g8):
    """Steps ``h0 + q·sk - 1`` down to 0 of rows ``i0 + q`` (``q`` < 8), one row
    at a time (:func:`_row_steps`), from the blocks' state."""
    for q in range(8):
        i = i0 + q
        _row_steps(r, v, lr, nv, has_next, d, has_term, tr, g8[q], _f8(lcol[i]), i, h0 + q * sk, 0, sx[q], sv[q],
                   rb, cb, pb, vs, adv)


@njit(inline="always")
def _lane_group(r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, state32,
                h0, nb, tb, nt, sk, vs, adv, i0):
    """Rows ``i0 .. i0 + 7`` of :func:`vtrace_lanes` or, with ``has_next``,
    :func:`vtrace_lanes_next`: in row ``i0 + q``, the steps from ``tb + q·sk``
    on one row at a time, the ``nb`` blocks from the end (lane ``q`` runs
    ``q·sk`` steps after lane 0; ``nv`` and ``tr`` read only with
    ``has_next``), the steps before ``h0 + q·sk`` one row at a time, and a
    store fence after non-temporal stores (``nt``)."""
    sx, sv, g8, gl8 = _lane_group_tails(r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry,
                                        rb, cb, pb, vs, adv, i0, tb, sk)
    for b in range(nb):
        t0 = tb - _LANE_STEPS * (b + 1)
        if has_next and state32:
            _vlanes32_next(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, nv, tr, nt, False, sk)
        elif has_next:
            _vlanes_next(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, nv, tr, nt, False, sk)
        elif has_term and state32:
            _vlanes32_term(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, v, d, nt, False, sk)
        elif has_term:
            _vlanes_term(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, v, d, nt, False, sk)
        elif state32:
            _vlanes32_plain(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, v, d, nt, False, sk)
        else:
            _vlanes_plain(r, v, lr, d, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, v, d, nt, False, sk)
    _lane_group_heads(r, v, lr, nv, has_next, d, has_term, tr, lcol, rb, cb, pb, vs, adv, i0, h0, sk, sx, sv, g8)
    if nt:
        sfence()


@_kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _ro(types.uint8, 2), types.boolean,
                     _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), types.float64, types.float64,
                     types.float64, types.boolean, types.int64, types.boolean, types.Array(_F4T, 2, "A"),
                     types.Array(_F4T, 2, "A")), None],
         parallel=True, fastmath=_FM)
def vtrace_lanes(r, v, lr, d, has_term, gcol, lcol, bound, carry, rb, cb, pb, state32, phase, stream, vs, adv):
    """V-trace on float32 rows contiguous along time, plain or with
    terminations (``d``, read when ``has_term``), eight rows at a time in SIMD
    lanes: rows ``0 .. 8·(R // 8) − 1`` (the caller runs the others through
    :func:`vtrace_fused`).

    The blocks of 16 steps start at steps ``phase + 16·k`` (``phase`` <
    16; 0 where the row is shorter than ``phase + 16``), lane ``q``'s
    ``q·sk`` steps after lane 0's (``sk`` from the row's length,
    :func:`gaescan.kernels.cpu._lane_span`).  Each group of 8
    rows first runs each row's steps after its last block one row at a time (the
    bits of :func:`vtrace_fused`), then its blocks from the end, each one
    call of the ``_vlanes_*`` block, with the same terms in the same order,
    float32 where :func:`gaescan.kernels._lanes.vtrace_lanes_block` says
    (:func:`_exp`'s float64 terms and bits in a block with a log-ratio
    outside ``[-87, 88]``), then each row's steps before its first block one
    row at a time.
    ``bound`` and ``carry`` are ``last_value`` and ``last_trace`` per row.

    With ``stream`` the blocks write ``vs`` and ``adv`` by non-temporal
    stores: the caller guarantees that step ``phase`` of every row of both
    starts a 64-byte line (:func:`gaescan.backends.numba_cpu._stream`), so
    that every block's loads and stores are aligned too where the inputs
    share the outputs' alignment.  Which steps run in blocks moves with
    ``phase`` and the row's length, and the blocks' float32 terms differ
    from the one-row steps' by roundings, so the last bits of a result depend
    on ``phase`` (within the contract's tolerance); for given buffers they
    are the same on every call and thread count.

    With ``state32`` the blocks carry the trace ``D`` in float32 (every term
    on ``<8 x float>``; :func:`gaescan.kernels._lanes.vtrace_lanes_block`):
    the caller's choice where the decay ``γλ·min(c̄, e)`` and the weight
    ``min(ρ̄, e)`` are bounded as for GAE's float32 state
    (:func:`gaescan.backends.vtrace_numba._state32`).
    """
    R, T = r.shape
    h0, nb, tb, nt, sk = _lane_span(T, phase, stream)
    for grp in prange(R // 8):
        _lane_group(r, v, lr, v, False, d, has_term, d, gcol, lcol, bound, carry, rb, cb, pb, state32,
                    h0, nb, tb, nt, sk, vs, adv, grp * 8)


@_kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _ro(types.uint8, 2),
                     _ro(types.uint8, 2), _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), types.float64,
                     types.float64, types.float64, types.boolean, types.int64, types.boolean,
                     types.Array(_F4T, 2, "A"), types.Array(_F4T, 2, "A")), None],
         parallel=True, fastmath=_FM)
def vtrace_lanes_next(r, v, lr, nv, d, tr, gcol, lcol, carry, rb, cb, pb, state32, phase, stream, vs, adv):
    """:func:`vtrace_lanes` with ``next_values`` (``nv``): terminations ``d``
    and truncations ``tr`` (uint8, both read, consecutive along time), rows
    ``0 .. 8·(R // 8) − 1`` (the caller runs the others through
    :func:`vtrace_fused`).  ``carry`` is ``last_trace`` per row; the
    bootstrap of each step is ``nv``'s, so ``last_value`` is not read.
    ``phase`` and ``stream`` as in :func:`vtrace_lanes`."""
    R, T = r.shape
    h0, nb, tb, nt, sk = _lane_span(T, phase, stream)
    for grp in prange(R // 8):
        _lane_group(r, v, lr, nv, True, d, True, tr, gcol, lcol, carry, carry, rb, cb, pb, state32,
                    h0, nb, tb, nt, sk, vs, adv, grp * 8)


# --------------------------------------------------------------------------- time-major fast path
#
# The same calls on time-major buffers (``axis=0`` of C-contiguous ``[T, B]``
# arrays): the kernel takes the ``(T, R)`` transposes, runs the scan over t
# and sweeps a block of batch columns at each step, reading memory in order.
# The columns' chains are independent, but LLVM does not vectorise the sweep
# (its asm holds scalar float64 operations): float32 calls without
# next_values take vtrace_timemajor_lanes below, which puts eight columns in
# SIMD lanes explicitly.  The carries of a block (``D``, ``V'``, γ and γλ of
# each column) are its only scratch.

_W = 1024  # batch columns per block


def _tm_sigs() -> list:
    out = []
    for ft in _FLOATS:
        data = types.Array(ft, 2, "C", readonly=True)
        flag = _ro(types.uint8, 2)
        col = _ro(ft, 1)
        res = types.Array(ft, 2, "C")
        f8, b = types.float64, types.boolean
        out.append(types.void(data, data, data, data, b, flag, b, flag, col, col, col, col, f8, f8, f8, res, res))
    return out


@_kernel(_tm_sigs(), parallel=True, fastmath=_FM)
def vtrace_timemajor(r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv):
    """:func:`vtrace_fused` on ``(T, R)`` C-contiguous arrays (the transposes of
    time-major row views); ``d`` and ``tr`` are uint8 ``(T, R)`` views of any
    strides, read as in :func:`vtrace_fused`."""
    T, R = r.shape
    ft = vs.dtype.type
    # Narrow batches get 4 blocks of at least 64 columns, so that they still
    # spread over threads.  Columns are independent: the split changes no result.
    wb = _W if R >= 4 * _W else max(64, (R + 3) // 4)
    nb = (R + wb - 1) // wb
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        x = np.empty(w, _f8)
        vn = np.empty(w, _f8)
        gg = np.empty(w, _f8)
        ll = np.empty(w, _f8)
        for q in range(w):
            x[q] = carry[c0 + q]
            vn[q] = bound[c0 + q]
            gg[q] = gcol[c0 + q]
            ll[q] = lcol[c0 + q]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for q in range(w):
                c = np.uint64(c0 + q)
                vt = _f8(v[t, c])
                if has_next:
                    tm = d[t, c] != 0
                    dn = tm | (tr[t, c] != 0)
                    vp = _f8(nv[t, c])
                else:
                    tm = _flag_at(d, has_term, t, c)
                    dn = tm
                    vp = vn[q]
                xn, o, a = _core(_f8(r[t, c]), vt, _f8(lr[t, c]), vp, gg[q], ll[q], tm, dn, rb, cb, pb, x[q])
                vs[t, c] = ft(o)
                adv[t, c] = ft(a)
                x[q] = xn
                vn[q] = vt


@njit(inline="always", fastmath=_FM)
def _tm_column_steps(r, v, lr, d, has_term, c, t_end, t_stop, g, gl, x, vn, rb, cb, pb, vs, adv):
    """Steps ``t_end - 1`` down to ``t_stop`` of column ``c`` of ``(T, R)``
    arrays, one at a time (the operations of :func:`vtrace_fused`); returns
    the trace and the value after them."""
    for t in range(t_end - 1, t_stop - 1, -1):
        vt = _f8(v[t, c])
        x, o, a = _step(_f8(r[t, c]), vt, _f8(lr[t, c]), _flag_at(d, has_term, t, c), g, gl, vn, x, rb, cb, pb)
        vs[t, c] = np.float32(o)
        adv[t, c] = np.float32(a)
        vn = vt
    return x, vn


@_kernel([types.void(_ro(_F4T, 2), _ro(_F4T, 2), _ro(_F4T, 2), _ro(types.uint8, 2), types.boolean,
                     _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), _ro(_F4T, 1), types.float64, types.float64,
                     types.float64, types.boolean, types.int64, types.Array(_F4T, 2, "A"),
                     types.Array(_F4T, 2, "A")), None],
         parallel=True, fastmath=_FM)
def vtrace_timemajor_lanes(r, v, lr, d, has_term, gcol, lcol, bound, carry, rb, cb, pb, state32, threads, vs, adv):
    """V-trace on float32 ``(T, R)`` arrays contiguous along the batch (the
    transposes of time-major row views), plain or with terminations (``d``,
    read when ``has_term``, its columns consecutive), eight columns at a time
    in SIMD lanes, each step of them one vector load per array.

    Work comes in units of consecutive columns, one per thread of
    ``threads`` (64 to ``_W`` columns; columns are independent, so the split
    changes no result),
    so that each block reads contiguous stretches of each array.  Each group
    of 8 columns of a unit runs its last ``T % 16`` steps one column at a
    time, then the unit's spans of 16 steps from the end.  Per span, each
    group first checks its log-ratios' range (``_tm_outside``), then the
    span's four blocks of 4 steps run from the end, each over every group of
    the unit in turn, with the ``_vlanes_tm_*`` block (the batch-major
    block's terms, exponential and range rule over the same 16 steps, so
    the bits of :func:`vtrace_lanes` on the transposed arrays where it does
    not stream).  Blocks of 4 steps keep a block's vectors in registers and
    each span's lines in the L1 cache.  The last ``R % 8`` columns run one
    at a time.  ``bound`` and ``carry`` are ``last_value`` and
    ``last_trace`` per column.
    """
    T, R = r.shape
    tail = T % _LANE_STEPS
    tb = T - tail
    groups = R // 8
    wb = max(64, min(_W, (R + 8 * threads - 1) // (8 * threads) * 8))
    gu = (wb + 7) // 8  # groups per unit
    for u in prange((groups + gu - 1) // gu):
        n = min(gu, groups - gu * u)
        sx = np.empty(8 * n, _f8)
        sv = np.empty(8 * n, _f8)
        g8 = np.empty(8 * n, _f8)
        gl8 = np.empty(8 * n, _f8)
        wide = np.empty(n, np.bool_)
        c0 = 8 * gu * u
        for q in range(8 * n):
            c = c0 + q
            g = _f8(gcol[c])
            gl = g * _f8(lcol[c])
            x, vn = _tm_column_steps(r, v, lr, d, has_term, c, T, tb, g, gl, _f8(carry[c]), _f8(bound[c]),
                                     rb, cb, pb, vs, adv)
            sx[q] = x
            sv[q] = vn
            g8[q] = g
            gl8[q] = gl
        for b in range(tb // _LANE_STEPS):
            t16 = tb - _LANE_STEPS * (b + 1)
            for h in range(n):
                wide[h] = _tm_outside(lr, c0 + 8 * h, t16)
            for k in range(_LANE_STEPS // _TM_STEPS - 1, -1, -1):
                t0 = t16 + _TM_STEPS * k
                for h in range(n):
                    o = 8 * h
                    sxo, svo, g8o, gl8o = sx[o:o + 8], sv[o:o + 8], g8[o:o + 8], gl8[o:o + 8]
                    w = wide[h]
                    if has_term and state32:
                        _vlanes32_tm_term(r, v, lr, d, vs, adv, c0 + o, t0, sxo, svo, g8o, gl8o, rb, cb, pb, v, d,
                                          False, w, 0)
                    elif has_term:
                        _vlanes_tm_term(r, v, lr, d, vs, adv, c0 + o, t0, sxo, svo, g8o, gl8o, rb, cb, pb, v, d,
                                        False, w, 0)
                    elif state32:
                        _vlanes32_tm_plain(r, v, lr, d, vs, adv, c0 + o, t0, sxo, svo, g8o, gl8o, rb, cb, pb, v, d,
                                           False, w, 0)
                    else:
                        _vlanes_tm_plain(r, v, lr, d, vs, adv, c0 + o, t0, sxo, svo, g8o, gl8o, rb, cb, pb, v, d,
                                         False, w, 0)
    for c in prange(8 * groups, R):
        g = _f8(gcol[c])
        _tm_column_steps(r, v, lr, d, has_term, c, T, 0, g, g * _f8(lcol[c]), _f8(carry[c]), _f8(bound[c]),
                         rb, cb, pb, vs, adv)
