"""Numba CPU kernels over ``(R, T)`` rows.

Every kernel takes the same argument kinds so that one compiled specialisation
per output dtype serves every call (signatures are explicit, compiled when
this module is first imported and cached on disk):

* data and coefficients are 2-D arrays of the output dtype with any strides
  (a scalar or per-row coefficient arrives as a zero-stride view);
* flags are 2-D bool arrays (an absent flag is a zero-stride view of False,
  an absent mask one of True);
* ``bound`` holds one boundary value per sequence (``last_value`` or
  ``initial``); ``cu`` the packed offsets, read when ``packed`` is true;
* ``zero`` is 0 of the output dtype, so every intermediate stays in that dtype
  (a bare ``0.0`` literal would promote float32 work to float64).

Sequences run in parallel (``prange``); each one is a serial scan.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

_FLOATS = (types.float32, types.float64)


def _ro(dtype: types.Type, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "A", readonly=True)


def _sigs(build):
    return [build(ft, _ro(ft, 2), _ro(types.boolean, 2), types.Array(ft, 2, "A")) for ft in _FLOATS]


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
        types.boolean, _ro(ft, 1), _CU, types.boolean, ft, out, out)),
    parallel=True, nogil=True, cache=True,
)
def gae_rows(rewards, values, next_values, gamma, lam, term, trunc, mask,
             has_next, bound, cu, packed, zero, adv, ret):
    """``A_t = δ_t + γλ(1−done_t) A_{τ(t)}``, ``R_t = A_t + V_t`` per sequence.

    ``V'_t`` is ``next_values[r, t]`` when ``has_next``, else the value at the
    next unmasked position, else ``bound[s]`` (``last_value``).
    """
    T = rewards.shape[1]
    for s in prange(bound.shape[0]):
        r, lo, hi = _segment(s, packed, cu, T)
        a_next = zero
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
                y = a[r, t] * y + b[r, t]
                out[r, t] = y
        else:
            for t in range(T):
                y = a[r, t] * y + b[r, t]
                out[r, t] = y
