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
the weights of a tile of steps in a vectorised loop first, then runs the
same fused step over the tile (see "fast path" below).  Both run sequences
in pairs (two independent chains in one loop hide each other's latency),
pairs in parallel (``prange``).  The exponential is computed inline
(:func:`_exp`, no library call), so that the weights' loop vectorises.  The state (``D``) and every product that meets it
are float64 whatever the output dtype (a float32 state drifts for decays
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

from .cpu import _CU, Kernel, _pair, _ro

_FLOATS = (types.float32, types.float64)
_f8 = np.float64
_FM = {"contract"}


def _kernel(signatures, **options):
    """Decorator: a lazy :class:`~gaescan.kernels.cpu.Kernel` without a float32-state build."""
    return lambda func: Kernel(func, signatures, narrow=False, **options)


# exp(x) in float64 without a library call, so that the step loops stay free
# of calls (and the elementwise loops vectorise): x = k·ln2 + r with |r| <= ln2/2,
# e^r by its Taylor polynomial to r^12 (truncation below 2e-16 relative),
# 2^k as the product of two powers of two built from their exponent bits
# (each within the float64 normal range, so their product spans the subnormals and the top).
# NaN, ±inf and the overflow and underflow ends are selects.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 rounded to 32 significant bits: k·_LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10  # ln 2 − _LN2_HI
_EXP_MAX = 709.782712893384  # above it e^x overflows float64


@intrinsic
def _as_f8(typingctx, bits):
    """The float64 whose bits are the int64 ``bits``."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@njit(inline="always", fastmath=_FM)
def _exp(x):
    xc = min(max(x, -745.5), 709.9)
    k = math.floor(xc * _LOG2E + 0.5)
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    ki = np.int64(k)
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
    dt = delta if dn else delta + g * (lam * _clip(cb, e)) * d_next
    vsp = vp if dn else vp + d_next
    a = _clip(pb, e) * (rt - vt if tm else rt + g * vsp - vt)
    return dt, vt + dt, a


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
                             _f8(next_values[i, u]) if has_next else _f8(vn), _f8(gamma[i, u]),
                             _f8(lam[i, u]), tm, tm or trunc[i, u] != 0, rb, cb, pb, dn)
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
                             _f8(next_values[i0, u]) if has_next else _f8(v0), _f8(gamma[i0, u]),
                             _f8(lam[i0, u]), tm, tm or trunc[i0, u] != 0, rb, cb, pb, d0)
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
                             _f8(next_values[i1, u]) if has_next else _f8(v1), _f8(gamma[i1, u]),
                             _f8(lam[i1, u]), tm, tm or trunc[i1, u] != 0, rb, cb, pb, d1)
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
# two passes per tile: (1) elementwise, in ascending order (vectorised: the
# exp above has no call), the weights ``ρ``, ``a = γ λ min(c̄, e^ℓ)`` and
# ``ρpg`` into float64 scratch of the tile's length (in L1); (2) backwards,
# the fused step: δ, ``D = δ`` at a done else ``δ + a·D`` (the only
# loop-carried chain, two rows interleaved) and both outputs.  Each input
# element is read from memory once and each output written once.  The walk
# over tiles descends, with no software prefetches: a build that requests
# each tile two tiles ahead is no faster, even on a CPU whose prefetchers do
# not follow descending streams (figures in ``benchmarks/results/``).

_L = 128  # steps per tile: the float64 weights of two rows' tiles take 6 KiB


@njit(inline="always", fastmath=_FM)
def _weights(lr, i, lo, n, gl, rb, cb, pb, rho, a, pg):
    """Pass (1): the weights of steps ``lo .. lo + n - 1`` of row i (scratch index t - lo)."""
    for s in range(n):
        e = _exp(_f8(lr[i, np.uint64(lo + s)]))
        rho[s] = rb if rb < e else e
        a[s] = gl * (cb if cb < e else e)
        pg[s] = pb if pb < e else e


@njit(inline="always", fastmath=_FM)
def _fstep(rt, vt, vp, tm, dn, g, rho, a, pg, x):
    """Pass (2) at one step, on values only (arrays passed into a helper in the
    loop would cost reference counting at every step): returns the new ``D``
    and the step's ``vs`` and advantage."""
    # selects, not multiplications by (1 - flag): NaN isolation
    w = rt - vt if tm else rt + g * vp - vt
    delta = rho * w
    xn = delta if dn else delta + a * x
    return xn, vt + xn, pg * (w if dn else w + g * x)


@njit(fastmath=_FM, nogil=True, cache=True)
def _fused_unit(u, r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv):
    # Work unit u: rows 2u and 2u + 1, or the last row alone when R is odd.
    R, T = r.shape
    i = 2 * np.int64(u)
    k = i + 1 if i + 1 < R else i
    two = k != i
    g0 = _f8(gcol[i])
    g1 = _f8(gcol[k])
    rho0 = np.empty(_L, _f8)
    a0 = np.empty(_L, _f8)
    pg0 = np.empty(_L, _f8)
    rho1 = np.empty(_L, _f8)
    a1 = np.empty(_L, _f8)
    pg1 = np.empty(_L, _f8)
    x0 = _f8(carry[i])
    x1 = _f8(carry[k])
    v0 = bound[i]
    v1 = bound[k]
    hi = np.int64(T)
    while hi > 0:
        lo = max(hi - _L, 0)
        n = hi - lo
        _weights(lr, i, lo, n, g0 * _f8(lcol[i]), rb, cb, pb, rho0, a0, pg0)
        if two:
            _weights(lr, k, lo, n, g1 * _f8(lcol[k]), rb, cb, pb, rho1, a1, pg1)
        ft = vs.dtype.type
        for s in range(n - 1, -1, -1):
            t = np.uint64(lo + s)
            vt = v[i, t]
            if has_next:
                tm = d[i, t] != 0
                x0, o, q = _fstep(_f8(r[i, t]), _f8(vt), _f8(nv[i, t]), tm, tm or tr[i, t] != 0, g0,
                                  rho0[s], a0[s], pg0[s], x0)
            else:
                tm = has_term and d[i, t] != 0
                x0, o, q = _fstep(_f8(r[i, t]), _f8(vt), _f8(v0), tm, tm, g0, rho0[s], a0[s], pg0[s], x0)
            vs[i, t] = ft(o)
            adv[i, t] = ft(q)
            v0 = vt
            if two:
                vt = v[k, t]
                if has_next:
                    tm = d[k, t] != 0
                    x1, o, q = _fstep(_f8(r[k, t]), _f8(vt), _f8(nv[k, t]), tm, tm or tr[k, t] != 0, g1,
                                      rho1[s], a1[s], pg1[s], x1)
                else:
                    tm = has_term and d[k, t] != 0
                    x1, o, q = _fstep(_f8(r[k, t]), _f8(vt), _f8(v1), tm, tm, g1, rho1[s], a1[s], pg1[s], x1)
                vs[k, t] = ft(o)
                adv[k, t] = ft(q)
                v1 = vt
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
        _fused_unit(u, r, v, lr, nv, has_next, d, has_term, tr, gcol, lcol, bound, carry, rb, cb, pb, vs, adv)


# --------------------------------------------------------------------------- time-major fast path
#
# The same calls on time-major buffers (``axis=0`` of C-contiguous ``[T, B]``
# arrays): the kernel takes the ``(T, R)`` transposes, runs the scan over t
# and sweeps a block of batch columns at each step, reading memory in order;
# the columns' chains are independent, so the sweep vectorises (exp
# included).  The carries of a block (``D``, ``V'``, γ and γλ of each column)
# are its only scratch.

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
                    dn = tm or tr[t, c] != 0
                    vp = _f8(nv[t, c])
                else:
                    tm = has_term and d[t, c] != 0
                    dn = tm
                    vp = vn[q]
                xn, o, a = _core(_f8(r[t, c]), vt, _f8(lr[t, c]), vp, gg[q], ll[q], tm, dn, rb, cb, pb, x[q])
                vs[t, c] = ft(o)
                adv[t, c] = ft(a)
                x[q] = xn
                vn[q] = vt
