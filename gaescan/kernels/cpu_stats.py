"""Numba CPU kernels of the statistics functions: group normalisation and masked moments.

The kernels are lazy :class:`gaescan.kernels.cpu.Kernel` objects (compiled, or
loaded from Numba's disk cache, on first use), one signature per float
dtype, picked by the dtype of the last argument.  Validation, casting and
allocation happen in :mod:`gaescan.backends.stats_numba`; the kernels only
loop and write into arrays the caller allocated.

Statistics accumulate in float64 whatever the data dtype: float32 data are
widened where they are read, and outputs are rounded on store.

*Groups* (:func:`group_norm_sorted`, :func:`group_norm_fixed`): one
``prange`` iteration per group.  A group's members are either the positions
``order[offsets[g]:offsets[g + 1]]`` (arbitrary labels, sorted by the
caller) or ``g·n .. g·n + n − 1`` (``group_size``).  Each group is two passes
over its members in index order: the sum, then the centred sum of squares
around the mean, so results do not depend on the thread count.

*Moments* (:func:`masked_moments`): the flat data is cut into chunks of a
fixed length (a parameter, not the thread count); each chunk computes its
count, mean and ``m2`` centred to float64 precision (one pass of sums
shifted by a pilot mean, or two centred passes where the pilot does not fit
the chunk), and the chunk results are merged in chunk order with the
pairwise (Chan) update.  So the result is the same bit for bit at any
thread count.  The masked elements are selected out (``x if m else 0``): a
NaN or inf at a masked position reaches no sum.

*Normalisation* (:func:`masked_normalize`): ``y = (x − mean)·inv + shift``
at valid positions, exactly 0 at masked ones, in parallel chunks.

The loops over positions run on unsigned indices (``range(np.uint64(lo),
np.uint64(hi))``): a signed index carries Numba's negative-index wraparound,
which keeps LLVM from vectorising the loop.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types

from .cpu import Kernel

_FLOATS = (types.float32, types.float64)
_f8 = np.float64


def _ro(dtype: types.Type, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "A", readonly=True)


def _roc(dtype: types.Type) -> types.Array:
    return types.Array(dtype, 1, "C", readonly=True)


_I8 = _ro(types.int64, 1)
# The flat data kernels take contiguous arrays: a known unit stride lets LLVM vectorise them.
_U1 = _roc(types.uint8)
_F8OUT = types.Array(types.float64, 1, "C")


def _group_sigs_sorted() -> list:
    return [types.void(_ro(ft, 1), _I8, _I8, types.boolean, types.boolean, types.int64, types.float64,
                       types.Array(ft, 1, "A")) for ft in _FLOATS]


def _group_sigs_fixed() -> list:
    return [types.void(_ro(ft, 1), types.int64, types.boolean, types.boolean, types.int64, types.float64,
                       types.Array(ft, 1, "A")) for ft in _FLOATS]


def _gn_sorted(scores, order, offsets, loo, scale, ddof, eps, out):
    """Group normalisation over sorted label groups.

    Parameters
    ----------
    scores : 1-D float array
        One score per sequence.
    order : 1-D int64 array
        The positions sorted by label (stable: each group in index order).
    offsets : 1-D int64 array
        ``G + 1`` offsets into ``order``: group ``g`` is ``order[offsets[g]:offsets[g + 1]]``.
    loo, scale : bool
        Leave-one-out baseline; divide by ``σ + eps``.
    ddof : int
        Delta degrees of freedom of ``σ``.
    eps : float
        Added to ``σ``.
    out : 1-D float array
        The advantages (every position is written).
    """
    G = offsets.shape[0] - 1
    for g in prange(G):
        lo = offsets[g]
        hi = offsets[g + 1]
        n = hi - lo
        if n == 0:
            continue
        if n == 1 or (scale and n <= ddof):
            for k in range(np.uint64(lo), np.uint64(hi)):
                i = order[k]
                out[i] = scores[i]
            continue
        s = 0.0
        for k in range(np.uint64(lo), np.uint64(hi)):
            s += _f8(scores[order[k]])
        mean = s / n
        inv = 1.0
        if scale:
            m2 = 0.0
            for k in range(np.uint64(lo), np.uint64(hi)):
                d = _f8(scores[order[k]]) - mean
                m2 += d * d
            inv = 1.0 / (math.sqrt(m2 / (n - ddof)) + eps)
        # The leave-one-out baseline (sum − s_i)/(n − 1) gives
        # s_i − b_i = (s_i − mean)·n/(n − 1): a centred difference, not one of two large sums.
        f = n / (n - 1.0) if loo else 1.0
        for k in range(np.uint64(lo), np.uint64(hi)):
            i = order[k]
            out[i] = ((_f8(scores[i]) - mean) * f) * inv


def _gn_fixed(scores, n, loo, scale, ddof, eps, out):
    """Group normalisation over consecutive groups of ``n`` (``group_size``).

    The arguments are those of :func:`group_norm_sorted`, with the group
    size ``n`` (dividing ``len(scores)``) in place of ``order`` and ``offsets``.
    """
    G = scores.shape[0] // n
    for g in prange(G):
        lo = g * n
        hi = lo + n
        if n == 1 or (scale and n <= ddof):
            for i in range(np.uint64(lo), np.uint64(hi)):
                out[i] = scores[i]
            continue
        s = 0.0
        for i in range(np.uint64(lo), np.uint64(hi)):
            s += _f8(scores[i])
        mean = s / n
        inv = 1.0
        if scale:
            m2 = 0.0
            for i in range(np.uint64(lo), np.uint64(hi)):
                d = _f8(scores[i]) - mean
                m2 += d * d
            inv = 1.0 / (math.sqrt(m2 / (n - ddof)) + eps)
        f = n / (n - 1.0) if loo else 1.0
        for i in range(np.uint64(lo), np.uint64(hi)):
            out[i] = ((_f8(scores[i]) - mean) * f) * inv


@njit(inline="always")
def _chunk_two_pass(mask, has_mask, x, lo, hi):
    """``(count, mean, m2)`` of one chunk in two passes (the mean, then the centred squares)."""
    s = 0.0
    k = 0
    if has_mask:
        for i in range(np.uint64(lo), np.uint64(hi)):
            valid = mask[i] != 0
            v = _f8(x[i])
            s += v if valid else 0.0
            k += valid
    else:
        for i in range(np.uint64(lo), np.uint64(hi)):
            s += _f8(x[i])
        k = hi - lo
    if k == 0:
        return 0.0, 0.0, 0.0
    mean = s / k
    m2 = 0.0
    if has_mask:
        for i in range(np.uint64(lo), np.uint64(hi)):
            d = _f8(x[i]) - mean
            m2 += d * d if mask[i] != 0 else 0.0
    else:
        for i in range(np.uint64(lo), np.uint64(hi)):
            d = _f8(x[i]) - mean
            m2 += d * d
    return float(k), mean, m2


def _moments(mask, has_mask, chunk, res, x):
    """Count, mean and centred ``m2`` of ``x`` where ``mask`` is nonzero.

    Each chunk is one pass of sums shifted by a pilot mean ``K`` (the exact
    mean of the first chunk that holds a valid element):
    ``s1 = Σ (x − K)``, ``s2 = Σ (x − K)²``, and ``m2 = s2 − s1²/k``.  The
    subtraction loses at most a factor 2 of relative precision while the
    offset term ``s1²/k`` is at most half of ``s2``, which holds unless the
    chunk's mean sits more than about one of its standard deviations from
    ``K``; a chunk where it does not hold (drifting data, a NaN) is
    recomputed in two centred passes.  So every chunk's ``m2`` is centred to
    float64 precision, with one pass over the data where the pilot fits.

    Parameters
    ----------
    mask : 1-D uint8 array
        Nonzero = valid; read only when ``has_mask`` (else any array).
    has_mask : bool
        Whether there is a mask (else every element is valid).
    chunk : int
        The chunk length; it fixes the order of every sum.
    res : 1-D float64 array of length 3
        Receives ``(count, mean, m2)``; ``mean = m2 = 0`` when ``count == 0``.
    x : 1-D float array
        The data (last, so that its dtype picks the signature).
    """
    N = x.shape[0]
    nchunks = (N + chunk - 1) // chunk
    parts = np.zeros((nchunks, 3), dtype=np.float64)
    # The pilot: the exact mean of the first chunk with a valid element (its
    # statistics are kept as they are).
    first = nchunks
    K = 0.0
    for c in range(nchunks):
        lo = c * chunk
        n0, m0, v0 = _chunk_two_pass(mask, has_mask, x, lo, min(lo + chunk, N))
        if n0 > 0.0:
            parts[c, 0] = n0
            parts[c, 1] = m0
            parts[c, 2] = v0
            K = m0
            first = c
            break
    for c in prange(first + 1, nchunks):
        lo = c * chunk
        hi = min(lo + chunk, N)
        # Branch-free loops (selects), so that they vectorise.
        s1 = 0.0
        s2 = 0.0
        k = 0
        if has_mask:
            for i in range(np.uint64(lo), np.uint64(hi)):
                valid = mask[i] != 0
                d = _f8(x[i]) - K
                s1 += d if valid else 0.0
                s2 += d * d if valid else 0.0
                k += valid
        else:
            for i in range(np.uint64(lo), np.uint64(hi)):
                d = _f8(x[i]) - K
                s1 += d
                s2 += d * d
            k = hi - lo
        if k == 0:
            continue
        off = s1 / k
        if off * s1 <= 0.5 * s2:
            parts[c, 0] = k
            parts[c, 1] = K + off
            parts[c, 2] = s2 - off * s1
        else:
            n1, m1, v1 = _chunk_two_pass(mask, has_mask, x, lo, hi)
            parts[c, 0] = n1
            parts[c, 1] = m1
            parts[c, 2] = v1
    # Chan's pairwise update, in chunk order.
    n = 0.0
    mean = 0.0
    m2 = 0.0
    for c in range(nchunks):
        nb = parts[c, 0]
        if nb == 0.0:
            continue
        if n == 0.0:
            n, mean, m2 = nb, parts[c, 1], parts[c, 2]
            continue
        tot = n + nb
        delta = parts[c, 1] - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + parts[c, 2] + delta * delta * (n * nb / tot)
        n = tot
    res[0] = n
    res[1] = mean
    res[2] = m2


def _normalize(x, mask, has_mask, mean, inv, shift, chunk, y):
    """``y = (x − mean)·inv + shift`` where ``mask`` is nonzero (or everywhere
    without ``has_mask``), else exactly 0.

    ``mean``, ``inv`` and ``shift`` are float64; ``y`` (last) has the output dtype.
    """
    N = x.shape[0]
    nchunks = (N + chunk - 1) // chunk
    zero = y.dtype.type(0)
    for c in prange(nchunks):
        lo = c * chunk
        hi = min(lo + chunk, N)
        if has_mask:
            for i in range(np.uint64(lo), np.uint64(hi)):
                v = y.dtype.type((_f8(x[i]) - mean) * inv + shift)
                y[i] = v if mask[i] != 0 else zero
        else:
            for i in range(np.uint64(lo), np.uint64(hi)):
                y[i] = (_f8(x[i]) - mean) * inv + shift


def _kernel(func, signatures, **options) -> Kernel:
    """A lazy :class:`~gaescan.kernels.cpu.Kernel` without a float32-state
    build: these kernels' sums are float64 by design.

    Divisions follow IEEE 754 (Numba's ``error_model="numpy"``): ``σ + eps``
    is zero for a group of equal scores with ``eps = 0``, and its advantages
    are then ``0/0 = NaN``, as in the references and the other backends, not a
    ``ZeroDivisionError`` raised from inside the kernel.
    """
    return Kernel(func, signatures, narrow=False, error_model="numpy", **options)


group_norm_sorted = _kernel(_gn_sorted, _group_sigs_sorted(), parallel=True)
group_norm_fixed = _kernel(_gn_fixed, _group_sigs_fixed(), parallel=True)
masked_moments = _kernel(
    _moments, [types.void(_U1, types.boolean, types.int64, _F8OUT, _roc(ft)) for ft in _FLOATS],
    parallel=True,
    # Reassociation lets LLVM vectorise the in-chunk sums; the chunking, and
    # the merge order of the chunks, stay fixed, so results stay deterministic.
    fastmath={"reassoc"},
)
masked_normalize = _kernel(
    _normalize,
    [types.void(_roc(ft), _U1, types.boolean, types.float64, types.float64, types.float64, types.int64,
                types.Array(ft, 1, "C")) for ft in _FLOATS],
    parallel=True,
)
