"""Numba CPU kernels over ``(R, T)`` rows.

Every kernel has one explicit signature per output dtype (float32, float64),
compiled when this module is first imported and cached on disk (``cache=True``),
so that no call triggers a new specialisation.  The general kernels take the
same argument kinds:

* data and coefficients are 2-D arrays of the output dtype with any strides
  (a scalar or per-row coefficient arrives as a zero-stride view);
* flags are 2-D uint8 arrays, nonzero = true (a free view of bool / 1-byte
  integer flags; an absent flag is a zero-stride view of 0, an absent mask
  one of 1);
* ``bound`` holds one boundary value per sequence (``last_value`` or
  ``initial``), ``carry`` the GAE advantage past each sequence's end
  (``last_advantage``); ``cu`` the packed offsets, read when ``packed`` is true;
* ``zero`` is 0 of the output dtype, so every intermediate stays in that dtype
  (a bare ``0.0`` literal would promote float32 work to float64).

The general kernels below run sequences in parallel (``prange``), each one a
serial scan; they serve every feature combination.  The fast paths at the end
of the module (:func:`gae_rows_fused`, :func:`gae_timemajor`) serve plain
GAE with terminations and per-row/scalar γ, λ (the common RL case): fused
(δ computed on the fly, each output written once, no temporaries), one lean
serial chain per batch-major row, vectorised across the batch on time-major
buffers.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

_FLOATS = (types.float32, types.float64)


def _ro(dtype: types.Type, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "A", readonly=True)


def _sigs(build):
    return [build(ft, _ro(ft, 2), _ro(types.uint8, 2), types.Array(ft, 2, "A")) for ft in _FLOATS]


_CU = _ro(types.int64, 1)


@njit(inline="always")
def _segment(s, packed, cu, T):
    # prange indices are unsigned: unify row, start and stop as int64.
    i = np.int64(s)
    if packed:
        return np.int64(0), cu[i], cu[i + 1]
    return i, np.int64(0), np.int64(T)


@njit(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, data, data, data, flag, flag, flag,
        types.boolean, _ro(ft, 1), _ro(ft, 1), _CU, types.boolean, ft, out, out)),
    parallel=True, nogil=True, cache=True,
)
def gae_rows(rewards, values, next_values, gamma, lam, term, trunc, mask,
             has_next, bound, carry, cu, packed, zero, adv, ret):
    """``A_t = δ_t + γλ(1−done_t) A_{τ(t)}``, ``R_t = A_t + V_t`` per sequence.

    ``V'_t`` is ``next_values[r, t]`` when ``has_next``, else the value at the
    next unmasked position, else ``bound[s]`` (``last_value``).
    """
    T = rewards.shape[1]
    for s in prange(bound.shape[0]):
        r, lo, hi = _segment(s, packed, cu, T)
        a_next = carry[s]
        v_next = bound[s]
        for t in range(hi - 1, lo - 1, -1):
            if not mask[r, t]:
                adv[r, t] = zero
                ret[r, t] = zero
                continue
            g = gamma[r, t]
            vt = values[r, t]
            # Selects, not multiplications by (1 - flag): a NaN beyond an
            # episode end must not leak into it.
            if term[r, t]:
                delta = rewards[r, t] - vt
            else:
                vn = next_values[r, t] if has_next else v_next
                delta = rewards[r, t] + g * vn - vt
            if term[r, t] or trunc[r, t]:
                a = delta
            else:
                a = delta + g * lam[r, t] * a_next
            adv[r, t] = a
            ret[r, t] = a + vt
            a_next = a
            v_next = vt


@njit(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, flag, flag, _ro(ft, 1), _CU, types.boolean, ft, out)),
    parallel=True, nogil=True, cache=True,
)
def returns_rows(rewards, gamma, dones, mask, bound, cu, packed, zero, out):
    """``G_t = r_t + γ(1−done_t) G_{τ(t)}``, ``G`` past the end = ``bound[s]``."""
    T = rewards.shape[1]
    for s in prange(bound.shape[0]):
        r, lo, hi = _segment(s, packed, cu, T)
        G = bound[s]
        for t in range(hi - 1, lo - 1, -1):
            if not mask[r, t]:
                out[r, t] = zero
                continue
            if dones[r, t]:
                G = rewards[r, t]
            else:
                G = rewards[r, t] + gamma[r, t] * G
            out[r, t] = G


@njit(
    _sigs(lambda ft, data, flag, out: types.void(data, data, types.boolean, _ro(ft, 1), out)),
    parallel=True, nogil=True, cache=True,
)
def scan_rows(a, b, reverse, initial, out):
    """``y_t = a_t y_{t∓1} + b_t`` per row, starting from ``initial[r]``."""
    R, T = b.shape
    for r in prange(R):
        y = initial[r]
        if reverse:
            for t in range(T - 1, -1, -1):
                y = b[r, t] if a[r, t] == 0 else a[r, t] * y + b[r, t]
                out[r, t] = y
        else:
            for t in range(T):
                y = b[r, t] if a[r, t] == 0 else a[r, t] * y + b[r, t]
                out[r, t] = y


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


@njit(
    _sigs(lambda ft, data, flag, out: types.void(
        data, data, data, data, data, flag, flag, flag,
        types.boolean, _ro(ft, 1), _ro(ft, 1), ft, out, out)),
    parallel=True, nogil=True, cache=True,
)
def gae_tm(rewards, values, next_values, gamma, lam, term, trunc, mask,
           has_next, bound, carry, zero, adv, ret):
    """:func:`gae_rows` on ``(T, R)`` transposed views (no packing)."""
    T, R = rewards.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        an = np.empty(w, adv.dtype)
        vn = np.empty(w, adv.dtype)
        for k in range(w):
            an[k] = carry[c0 + k]
            vn[k] = bound[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for k in range(w):
                c = np.uint64(c0 + k)
                if mask[t, c]:
                    vt = values[t, c]
                    g = gamma[t, c]
                    # Selects, as in gae_rows: nothing beyond an episode end leaks in.
                    if term[t, c]:
                        delta = rewards[t, c] - vt
                    else:
                        vp = next_values[t, c] if has_next else vn[k]
                        delta = rewards[t, c] + g * vp - vt
                    if term[t, c] or trunc[t, c]:
                        a = delta
                    else:
                        a = delta + g * lam[t, c] * an[k]
                    adv[t, c] = a
                    ret[t, c] = a + vt
                    an[k] = a
                    vn[k] = vt
                else:
                    adv[t, c] = zero
                    ret[t, c] = zero


@njit(
    _sigs(lambda ft, data, flag, out: types.void(data, data, flag, flag, _ro(ft, 1), ft, out)),
    parallel=True, nogil=True, cache=True,
)
def returns_tm(rewards, gamma, dones, mask, bound, zero, out):
    """:func:`returns_rows` on ``(T, R)`` transposed views (no packing)."""
    T, R = rewards.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        G = np.empty(w, out.dtype)
        for k in range(w):
            G[k] = bound[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            for k in range(w):
                c = np.uint64(c0 + k)
                if mask[t, c]:
                    if dones[t, c]:
                        G[k] = rewards[t, c]
                    else:
                        G[k] = rewards[t, c] + gamma[t, c] * G[k]
                    out[t, c] = G[k]
                else:
                    out[t, c] = zero


@njit(
    _sigs(lambda ft, data, flag, out: types.void(data, data, types.boolean, _ro(ft, 1), out)),
    parallel=True, nogil=True, cache=True,
)
def scan_tm(a, b, reverse, initial, out):
    """:func:`scan_rows` on ``(T, R)`` transposed views."""
    T, R = b.shape
    wb, nb = _blocks(R)
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        w = min(c0 + wb, R) - c0
        y = np.empty(w, out.dtype)
        for k in range(w):
            y[k] = initial[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j) if reverse else np.uint64(j)
            for k in range(w):
                c = np.uint64(c0 + k)
                y[k] = b[t, c] if a[t, c] == 0 else a[t, c] * y[k] + b[t, c]
                out[t, c] = y[k]


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


@njit(inline="always", fastmath=_FM)
def _gstep(rt, vt, vn, dt, g, gl, an):
    # A select, not a multiplication by (1 - done): NaN isolation.
    x = rt + g * vn - vt + gl * an
    y = rt - vt
    return y if dt else x


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_row(r, v, d, adv, ret, i, has_term, g, gl, vlast, alast):
    """Row ``i``, reverse in time, fused: δ on the fly, each output written once."""
    T = r.shape[1]
    an = alast
    vn = vlast
    if has_term:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            vt = v[i, t]
            an = _gstep(r[i, t], vt, vn, d[i, t] != 0, g, gl, an)
            adv[i, t] = an
            ret[i, t] = an + vt
            vn = vt
    else:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            vt = v[i, t]
            an = r[i, t] + g * vn - vt + gl * an
            adv[i, t] = an
            ret[i, t] = an + vt
            vn = vt


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_pair(r, v, d, adv, ret, i, has_term, g0, gl0, g1, gl1, vl0, vl1, al0, al1):
    """Rows ``i`` and ``i + 1`` in one loop: two independent chains hide each
    other's FMA-and-select latency, which bounds a lone chain (about 2.4 ns a
    step here, against 1.3 ns a step for the pair)."""
    T = r.shape[1]
    k = i + 1
    a0 = al0
    a1 = al1
    v0 = vl0
    v1 = vl1
    if has_term:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            x0 = v[i, t]
            x1 = v[k, t]
            a0 = _gstep(r[i, t], x0, v0, d[i, t] != 0, g0, gl0, a0)
            a1 = _gstep(r[k, t], x1, v1, d[k, t] != 0, g1, gl1, a1)
            adv[i, t] = a0
            ret[i, t] = a0 + x0
            adv[k, t] = a1
            ret[k, t] = a1 + x1
            v0 = x0
            v1 = x1
    else:
        for j in range(T):
            t = np.uint64(T - 1 - j)
            x0 = v[i, t]
            x1 = v[k, t]
            a0 = r[i, t] + g0 * v0 - x0 + gl0 * a0
            a1 = r[k, t] + g1 * v1 - x1 + gl1 * a1
            adv[i, t] = a0
            ret[i, t] = a0 + x0
            adv[k, t] = a1
            ret[k, t] = a1 + x1
            v0 = x0
            v1 = x1


@njit(fastmath=_FM, nogil=True, cache=True)
def _gae_unit(u, rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret):
    # Work unit u: rows 2u and 2u + 1, or the last row alone when R is odd.
    i = 2 * np.int64(u)
    g = gcol[i]
    if i + 1 < rewards.shape[0]:
        h = gcol[i + 1]
        _gae_pair(rewards, values, term, adv, ret, i, has_term, g, g * lcol[i], h, h * lcol[i + 1],
                  bound[i], bound[i + 1], carry[i], carry[i + 1])
    else:
        _gae_row(rewards, values, term, adv, ret, i, has_term, g, g * lcol[i], bound[i], carry[i])


_FUSED_SIGS = [
    types.void(_ro(ft, 2), _ro(ft, 2), _U8A, types.boolean, _ro(ft, 1), _ro(ft, 1), _ro(ft, 1),
               _ro(ft, 1), types.Array(ft, 2, "A"), types.Array(ft, 2, "A"))
    for ft in _FLOATS
]


@njit(_FUSED_SIGS, parallel=True, nogil=True, cache=True, fastmath=_FM)
def gae_rows_fused(rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret):
    """Batch-major fused GAE (per-row γ/λ, terminations; no mask/next_values),
    any strides, rows in pairs (see :func:`_gae_pair`).  ``term`` is a uint8
    view (nonzero = terminated), read only when ``has_term``.

    A chunked in-row variant (4 independent chains per cache-resident tile,
    carries combined between a carry pass and a rescan or a vectorised
    fix-up) was measured 1.4-1.6x *slower* than one chain per row on the
    2-vCPU development VM (the extra passes cost more than they hide);
    pairing rows hides the latency with no extra pass.
    """
    for u in prange((rewards.shape[0] + 1) // 2):
        _gae_unit(u, rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret)


@njit(_FUSED_SIGS, nogil=True, cache=True, fastmath=_FM)
def gae_rows_fused_1t(rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret):
    """:func:`gae_rows_fused` on the calling thread: for small problems, where
    waking the thread pool costs more than the work (same code, same bits)."""
    for u in range((rewards.shape[0] + 1) // 2):
        _gae_unit(u, rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret)


@njit(
    [types.void(_c2(ft), _c2(ft), _U8C, types.boolean, _ro(ft, 1), _ro(ft, 1), _ro(ft, 1), _ro(ft, 1),
                _c2(ft, False), _c2(ft, False)) for ft in _FLOATS],
    parallel=True, nogil=True, cache=True, fastmath=_FM,
)
def gae_timemajor(rewards, values, term, has_term, gcol, lcol, bound, carry, adv, ret):
    """Time-major fused GAE on ``(T, R)`` C-contiguous arrays (the transposes
    of time-major ``(R, T)`` row views): the scan runs over ``t`` and is
    vectorised across a block of batch columns (no transposition); the
    carries of a block (4 arrays of its width) are the only scratch."""
    T, R = rewards.shape
    # Blocks of _W columns (a 4 KiB page of float32 per step); narrow batches
    # get 4 blocks of at least 64 columns so that they still spread over
    # threads.  Columns are independent: the split never changes a result.
    wb = _W if R >= 4 * _W else max(64, (R + 3) // 4)
    nb = (R + wb - 1) // wb
    for bb in prange(nb):
        c0 = np.int64(bb) * wb
        c1 = min(c0 + wb, R)
        w = c1 - c0
        an = np.empty(w, rewards.dtype)
        vn = np.empty(w, rewards.dtype)
        gg = np.empty(w, rewards.dtype)
        gl = np.empty(w, rewards.dtype)
        for k in range(w):
            an[k] = carry[c0 + k]
            vn[k] = bound[c0 + k]
            gg[k] = gcol[c0 + k]
            gl[k] = gcol[c0 + k] * lcol[c0 + k]
        for j in range(T):
            t = np.uint64(T - 1 - j)
            if has_term:
                for k in range(w):
                    c = np.uint64(c0 + k)
                    v = values[t, c]
                    a = _gstep(rewards[t, c], v, vn[k], term[t, c] != 0, gg[k], gl[k], an[k])
                    adv[t, c] = a
                    ret[t, c] = a + v
                    an[k] = a
                    vn[k] = v
            else:
                for k in range(w):
                    c = np.uint64(c0 + k)
                    v = values[t, c]
                    a = rewards[t, c] + gg[k] * vn[k] - v + gl[k] * an[k]
                    adv[t, c] = a
                    ret[t, c] = a + v
                    an[k] = a
                    vn[k] = v
