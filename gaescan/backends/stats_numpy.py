"""The ``"numpy"`` backend of the statistics functions, written against the array API.

The code uses only functions NumPy and CuPy share (plus ``cupyx.scatter_add``
for the group sums on CuPy), so it runs on both, and on CuPy nothing is read
back to the host: the number of groups is never needed on the host, because
group ids are dense ranks in ``[0, B)`` and every per-group array has the
static length ``B``.  Everything is computed in float64 and rounded once on
store.

* Groups: a stable argsort of the labels; a position starts a new group where
  its sorted label differs from the previous one, and the running count of
  those starts is the group id.  Group counts, sums and centred sums of
  squares are segment sums over the ids (``numpy.bincount`` on the host,
  which adds in index order).  On CuPy the segment sums are atomic adds,
  whose order, and so the last bits of a result, may vary between runs.
* Moments: blocks of ``BLOCK`` elements, each two passes in float64 (the
  sum, then the centred squares), merged in block order with the pairwise
  update; the masked elements are selected out (``where``), so a NaN or inf
  there reaches no sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_F8 = np.float64


def _segment_sum(xp: Any, ids: Any, w: Any, size: int) -> Any:
    if xp is np:
        return np.bincount(ids, weights=w, minlength=size)
    import cupyx

    total = xp.zeros(size, dtype=_F8)
    cupyx.scatter_add(total, ids, w)
    return total


def _dense_ids(xp: Any, labels: Any) -> Any:
    """Each position's group as a dense rank of its label, in ``[0, B)``."""
    B = labels.shape[0]
    order = xp.argsort(labels, kind="stable") if xp is np else xp.argsort(labels)
    ordered = labels[order]
    starts = xp.empty(B, dtype=xp.int64)
    starts[:1] = 0
    starts[1:] = ordered[1:] != ordered[:-1]
    ids = xp.empty(B, dtype=xp.int64)
    ids[order] = xp.cumsum(starts)
    return ids


def group_normalize(xp: Any, scores: Any, labels: Any, group_size: int | None, loo: bool, scale: bool,
                    ddof: int, eps: float, out: Any) -> None:
    """Write the group-normalised advantages of ``scores`` into ``out`` (1-D, the output dtype)."""
    s = scores.astype(_F8)
    B = s.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if labels is None:
            g = s.reshape(B // group_size, group_size)
            mean = g.sum(axis=1, keepdims=True) / group_size
            d = (g - mean).reshape(B)
            m2 = ((g - mean) ** 2).sum(axis=1, keepdims=True) if scale else None
            n = xp.full((B // group_size, 1), float(group_size), dtype=_F8)
            n = xp.broadcast_to(n, (B // group_size, group_size)).reshape(B)
            if m2 is not None:
                m2 = xp.broadcast_to(m2, (B // group_size, group_size)).reshape(B)
        else:
            ids = _dense_ids(xp, labels)
            count = _segment_sum(xp, ids, xp.ones(B, dtype=_F8), B)
            sums = _segment_sum(xp, ids, s, B)
            mean = sums / xp.maximum(count, 1.0)
            d = s - mean[ids]
            n = count[ids]
            m2 = _segment_sum(xp, ids, d * d, B)[ids] if scale else None
        adv = d * (n / xp.maximum(n - 1.0, 1.0)) if loo else d
        if scale:
            sigma = xp.sqrt(m2 / xp.maximum(n - ddof, 1.0))
            adv = adv / (sigma + eps)
            trivial = (n == 1.0) | (n <= ddof)
        else:
            trivial = n == 1.0
        out[...] = xp.where(trivial, s, adv).astype(out.dtype)


#: Elements per block of the moments and whitening passes: the float64
#: temporaries are a few blocks, not a few copies of the input.
BLOCK = 1 << 20


# An infinite element makes ``x − mean`` (and Chan's ``ma + δ·…``) meet inf − inf:
# the NaN that results is the statistic's value, as in the references, not an error
# to warn about.
@np.errstate(invalid="ignore")
def _block_moments(xp: Any, flat: Any, m: Any) -> tuple[Any, Any, Any]:
    """Two float64 passes over one block: ``(count, mean, m2)`` as 0-d arrays."""
    f = flat.astype(_F8)
    if m is None:
        count = xp.asarray(float(f.shape[0]), dtype=_F8)
        mean = f.sum() / max(f.shape[0], 1)
        return count, mean, ((f - mean) ** 2).sum()
    count = m.sum(dtype=_F8)
    mean = xp.where(m, f, 0.0).sum() / xp.maximum(count, 1.0)
    d = xp.where(m, f - mean, 0.0)
    return count, mean, (d * d).sum()


@np.errstate(invalid="ignore")
def _merge(xp: Any, a: tuple, b: tuple) -> tuple[Any, Any, Any]:
    """Chan's pairwise update of two ``(count, mean, m2)``; an empty side is skipped."""
    na, ma, va = a
    nb, mb, vb = b
    n = na + nb
    safe = xp.maximum(n, 1.0)
    delta = mb - ma
    mean = xp.where(nb == 0, ma, xp.where(na == 0, mb, ma + delta * (nb / safe)))
    m2 = va + vb + xp.where((na == 0) | (nb == 0), 0.0, delta * delta * (na * nb / safe))
    return n, mean, m2


def moments(xp: Any, x: Any, mask: Any) -> tuple[Any, Any, Any]:
    """``(count, mean, m2)`` of ``x`` where ``mask`` is true, as 0-d float64 arrays of ``xp``.

    Blocks of ``BLOCK`` elements, each two passes, merged in block order.
    """
    flat = x.reshape(-1)
    m = None if mask is None else mask.reshape(-1) != 0
    N = flat.shape[0]
    acc = _block_moments(xp, flat[:BLOCK], None if m is None else m[:BLOCK])
    for lo in range(BLOCK, N, BLOCK):
        part = _block_moments(xp, flat[lo:lo + BLOCK], None if m is None else m[lo:lo + BLOCK])
        acc = _merge(xp, acc, part)
    return acc


def whiten(xp: Any, x: Any, mask: Any, stats: Any, shift_mean: bool, ddof: int, eps: float, out: Any) -> None:
    """Write the whitened ``x`` into ``out``; ``stats`` is ``None`` or ``(count, mean, m2)``."""
    if x.size == 0:
        return
    count, mean, m2 = moments(xp, x, mask) if stats is None else stats
    with np.errstate(divide="ignore", invalid="ignore"):
        var = xp.where(count > ddof, m2 / xp.maximum(count - ddof, 1.0), 0.0)
        inv = 1.0 / xp.sqrt(var + eps)
    shift = 0.0 if shift_mean else mean
    flat = x.reshape(-1)
    m = None if mask is None else mask.reshape(-1)
    direct = out.flags.c_contiguous
    y = out.reshape(-1) if direct else xp.empty(flat.shape[0], dtype=out.dtype)
    for lo in range(0, flat.shape[0], BLOCK):
        f = flat[lo:lo + BLOCK].astype(_F8)
        valid = count > 0 if m is None else (m[lo:lo + BLOCK] != 0) & (count > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            yb = (f - mean) * inv + shift
        y[lo:lo + BLOCK] = xp.where(valid, yb, 0.0).astype(out.dtype)
    if not direct:
        out[...] = y.reshape(out.shape)
