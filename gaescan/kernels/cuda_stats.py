"""Numba CUDA kernels of masked moments and whitening.

Three launches, all on the caller's stream, none read back to the host:

1. :func:`moments_partial` — block ``b`` owns the elements
   ``[b·per_block, (b + 1)·per_block)``; each thread runs Welford's update
   over its strided share of them (in float64), and the block merges its
   threads' ``(count, mean, m2)`` in a fixed shared-memory tree with the
   pairwise (Chan) update, writing one partial per block;
2. :func:`moments_final` — one block merges the partials the same way into
   ``stats = (count, mean, m2)`` in device memory;
3. :func:`normalize` — every thread reads ``stats`` and writes
   ``(x − mean)·inv + shift`` at valid positions, 0 at masked ones.

The number of blocks follows from the element count only, and every merge
has a fixed order, so results are the same bit for bit run after run.  A
masked element is not loaded at all.  The kernels compile lazily (plain
``cuda.jit``), so importing this module needs no GPU.
"""

from __future__ import annotations

import math

from numba import cuda, float64

#: Threads per block (a power of two: the shared-memory trees halve it).
THREADS = 256


@cuda.jit(device=True, inline=True)
def _merge(na, ma, m2a, nb, mb, m2b):
    """Chan's pairwise update of ``(count, mean, m2)``; an empty side is skipped."""
    if nb == 0.0:
        return na, ma, m2a
    if na == 0.0:
        return nb, mb, m2b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta * delta * (na * nb / n)


@cuda.jit(device=True, inline=True)
def _block_tree(sn, sm, sv, t):
    """Merge the block's ``THREADS`` shared entries into entry 0 (a fixed tree)."""
    s = THREADS // 2
    while s > 0:
        if t < s:
            n, m, v = _merge(sn[t], sm[t], sv[t], sn[t + s], sm[t + s], sv[t + s])
            sn[t] = n
            sm[t] = m
            sv[t] = v
        cuda.syncthreads()
        s //= 2


@cuda.jit
def moments_partial(x, mask, has_mask, per_block, parts):
    """One ``(count, mean, m2)`` partial per block, into ``parts[b, :]``."""
    sn = cuda.shared.array(THREADS, float64)
    sm = cuda.shared.array(THREADS, float64)
    sv = cuda.shared.array(THREADS, float64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    N = x.shape[0]
    lo = b * per_block
    hi = min(lo + per_block, N)
    n = 0.0
    mean = 0.0
    m2 = 0.0
    i = lo + t
    while i < hi:
        if not has_mask or mask[i] != 0:
            v = float64(x[i])
            n += 1.0
            d = v - mean
            mean += d / n
            m2 += d * (v - mean)
        i += THREADS
    sn[t] = n
    sm[t] = mean
    sv[t] = m2
    cuda.syncthreads()
    _block_tree(sn, sm, sv, t)
    if t == 0:
        parts[b, 0] = sn[0]
        parts[b, 1] = sm[0]
        parts[b, 2] = sv[0]


@cuda.jit
def moments_final(parts, stats):
    """Merge ``parts`` (one row per block, in block order per thread) into ``stats``; one block."""
    sn = cuda.shared.array(THREADS, float64)
    sm = cuda.shared.array(THREADS, float64)
    sv = cuda.shared.array(THREADS, float64)
    t = cuda.threadIdx.x
    n = 0.0
    mean = 0.0
    m2 = 0.0
    j = t
    while j < parts.shape[0]:
        n, mean, m2 = _merge(n, mean, m2, parts[j, 0], parts[j, 1], parts[j, 2])
        j += THREADS
    sn[t] = n
    sm[t] = mean
    sv[t] = m2
    cuda.syncthreads()
    _block_tree(sn, sm, sv, t)
    if t == 0:
        stats[0] = sn[0]
        stats[1] = sm[0]
        stats[2] = sv[0]


@cuda.jit
def normalize(x, mask, has_mask, stats, shift_mean, ddof, eps, y):
    """``y = (x − mean)/sqrt(var + eps)`` (``+ mean`` without ``shift_mean``) at valid positions, else 0."""
    count = stats[0]
    mean = stats[1]
    var = stats[2] / (count - ddof) if count > ddof else 0.0
    d = math.sqrt(var + eps)
    # d == 0 (var + eps == 0) gives inf as IEEE division does (the simulator's Python
    # division would raise); a NaN d (a non-finite valid element) gives NaN.
    inv = 1.0 / d if d != 0.0 else math.inf
    shift = 0.0 if shift_mean else mean
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    N = x.shape[0]
    while i < N:
        if count > 0.0 and (not has_mask or mask[i] != 0):
            y[i] = (float64(x[i]) - mean) * inv + shift
        else:
            y[i] = 0.0
        i += stride
