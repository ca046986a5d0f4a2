"""The map algebra of the CUDA kernels and the maps of single steps.

The state carried from later to earlier steps is a pair ``(A, Vn)``; a run of
steps acts on it as the map ``(alpha, beta, c, hv, Vf)`` (see
:mod:`gaescan.kernels.cuda` for the algebra).  :func:`build_maps` compiles,
for one :class:`~gaescan.kernels.cuda_spec.KernelSpec`, the device functions
that form, compose and apply those maps:

* ``compose(M1, M2)`` (``M1`` earlier in time, applied after ``M2``) and
  ``apply(M, A, Vn)``; ``identity_map`` (a masked step or a row past ``R``),
  ``reset_map`` (the constant map of a segment end);
* ``elem``: the map of one step from the inputs at ``[row, t]`` (or from the
  vector-loaded per-thread arrays), ``phys``: logical step to physical time;
  the inputs and the scalar parameters come as the named structures
  :class:`~gaescan.kernels.cuda_tile.Inputs` and
  :class:`~gaescan.kernels.cuda_tile.Params`;
* packed rows: ``seg_bound`` (an offset of ``cu`` clamped to ``[0, T]``) and
  ``find_seg`` (the segment holding a step, by binary search);
* boundary values: ``boundary`` (the value past a row or segment),
  ``carry_in`` (the advantage past it), ``start_state`` (the state entering a
  row's last tile);
* maps in shared memory and across lanes: ``write_map``, ``read_map``,
  ``shfl_map``.  A spec whose maps are the pair ``(alpha, c)`` (:attr:`nf` = 2)
  stores and shuffles two numbers, the others five.

Products with ``alpha == 0`` / ``beta == 0`` are skipped, not computed: a done
cut and a terminal bootstrap are selects, so a NaN or inf after an episode end
never reaches the episode before it.  A product of nonzero factors that
rounds to zero keeps the smallest subnormal of its sign, so that only a cut
is a zero.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import cuda

from .cuda_spec import (
    GAE_NEXT,
    GAE_V,
    OPT_GARR,
    OPT_LAARR,
    OPT_LARR,
    OPT_LVARR,
    OPT_TERM,
    OPT_TRUNC,
    RET,
    SCAN,
    KernelSpec,
)


def build_maps(spec: KernelSpec) -> SimpleNamespace:
    """The map and per-step device functions of the kernel ``spec``.

    Parameters
    ----------
    spec : KernelSpec
        The kernel's compile-time parameters.

    Returns
    -------
    types.SimpleNamespace
        The device functions, by name (see the module docstring).
    """
    KIND = spec.kind
    FWD = spec.fwd
    CAST = spec.cast
    MASKED = spec.masked
    PACKED = spec.packed
    USE_V = spec.use_v
    TINY = CAST(np.finfo(spec.dtype).smallest_subnormal)


    @cuda.jit(device=True)
    def compose(a1, b1, c1, h1, f1, a2, b2, c2, h2, f2):
        zero = CAST(0)
        if a1 == zero:
            a = zero
            b = zero
            c = c1
        else:
            a = a1 * a2
            b = a1 * b2
            c = cuda.fma(a1, c2, c1)
            # A product of nonzero factors that rounds to zero is no cut: it keeps
            # the smallest subnormal of its sign, so that apply still hands a NaN
            # or an infinity on, as the step-by-step recurrence does.
            if a == zero and a2 != zero:
                a = TINY if (a1 > zero) == (a2 > zero) else -TINY
            if b == zero and b2 != zero:
                b = TINY if (a1 > zero) == (b2 > zero) else -TINY
        if USE_V:
            if h2:
                if b1 != zero:
                    c = cuda.fma(b1, f2, c)
            else:
                b = b + b1
            h = h1 or h2
            f = f1 if h1 else f2
        else:
            h = False
            f = zero
        return a, b, c, h, f

    @cuda.jit(device=True)
    def apply(a, b, c, h, f, A, Vn):
        zero = CAST(0)
        s = c
        if USE_V:
            if b != zero:
                s = cuda.fma(b, Vn, c)
        if a != zero:
            s = cuda.fma(a, A, s)
        if USE_V and h:
            return s, f
        return s, Vn

    @cuda.jit(device=True)
    def identity_map():
        zero = CAST(0)
        return CAST(1), zero, zero, False, zero

    @cuda.jit(device=True)
    def reset_map(bv, bc):
        zero = CAST(0)
        if KIND == RET:
            return zero, zero, bv, True, zero
        return zero, zero, bc, True, bv

    @cuda.jit(device=True)
    def phys(u, T):
        if FWD:
            return T - 1 - u
        return u

    @cuda.jit(device=True)
    def seg_bound(cu, s, T):
        # cu[s] clamped to [0, T] (device-side reads only; bad offsets stay in bounds).
        v = cu[s]
        if v < 0:
            v = 0
        if v > T:
            v = T
        return v

    @cuda.jit(device=True)
    def boundary(inp, prm, s):
        # The value past row or segment s.
        if prm.opts & OPT_LVARR:
            return CAST(inp.lv[s])
        return prm.lv_s

    @cuda.jit(device=True)
    def carry_in(inp, prm, s):
        # The advantage past row or segment s (GAE).
        if prm.opts & OPT_LAARR:
            return CAST(inp.lv[prm.nseg + s])
        return CAST(0)

    @cuda.jit(device=True)
    def elem(row, t, src, srow, st, inp, prm, ns):
        # Rewards and values at [srow, st] of src, the triple (r, v, nv): the
        # vector-loaded per-thread arrays of load, or the inputs' arrays at
        # [row, t]; next values there too if ns (vector-loaded), else the
        # input's at [row, t]; gammas, lambdas and flags always at [row, t].
        r, v, nv = src
        zero = CAST(0)
        one = CAST(1)
        opts = prm.opts
        if MASKED:
            if inp.mask[row, t] == 0:
                return False, one, zero, zero, zero
        gt = prm.g_s
        if opts & OPT_GARR:
            gt = CAST(inp.g[row, t])
        tm = False
        tr = False
        if KIND != SCAN:
            if opts & OPT_TERM:
                tm = inp.term[row, t] != 0
            if opts & OPT_TRUNC:
                tr = inp.trunc[row, t] != 0
        rt = CAST(r[srow, st])
        if KIND == SCAN:
            return True, gt, zero, rt, zero
        if KIND == RET:
            return True, (zero if tm else gt), zero, rt, zero
        lt = CAST(inp.lm[row, t]) if opts & OPT_LARR else prm.l_s
        vt = CAST(v[srow, st])
        a = zero if (tm or tr) else gt * lt
        if KIND == GAE_V:
            return True, a, (zero if tm else gt), rt - vt, vt
        if tm:
            c = rt - vt
        else:
            c = (rt + gt * (CAST(nv[srow, st]) if ns else CAST(inp.nv[row, t]))) - vt
        return True, a, zero, c, vt

    @cuda.jit(device=True)
    def find_seg(cu, nseg, u, T):
        # Largest s in [0, nseg) with cu[s] <= u (or -1); binary search.
        lo = 0
        hi = nseg  # invariant: answer in [lo-1, hi-1]
        while lo < hi:
            mid = (lo + hi) // 2
            if seg_bound(cu, mid, T) <= u:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    @cuda.jit(device=True)
    def start_state(inp, prm, row):
        zero = CAST(0)
        if PACKED:
            return zero, zero  # the segment ends restart the state
        bv = boundary(inp, prm, row)
        if KIND == GAE_V or KIND == GAE_NEXT:
            return carry_in(inp, prm, row), bv
        return bv, zero

    @cuda.jit(device=True)
    def write_map(shx, idx, a, b, c, h, f):
        shx[0, idx] = a
        shx[1, idx] = c
        if USE_V:
            shx[2, idx] = b
            shx[3, idx] = CAST(1) if h else CAST(0)
            shx[4, idx] = f

    @cuda.jit(device=True)
    def read_map(sh, idx):
        zero = CAST(0)
        if USE_V:
            return sh[0, idx], sh[2, idx], sh[1, idx], sh[3, idx] != zero, sh[4, idx]
        return sh[0, idx], zero, sh[1, idx], False, zero

    @cuda.jit(device=True)
    def shfl_map(wmask, ma, mb, mc, mh, mf, delta):
        """The map of the lane ``delta`` above (every lane of the warp must call this)."""
        oa = cuda.shfl_down_sync(wmask, ma, delta)
        oc = cuda.shfl_down_sync(wmask, mc, delta)
        if USE_V:
            ob = cuda.shfl_down_sync(wmask, mb, delta)
            oh = cuda.shfl_down_sync(wmask, np.int32(1) if mh else np.int32(0), delta) != 0
            of = cuda.shfl_down_sync(wmask, mf, delta)
        else:
            zero = CAST(0)
            ob = zero
            oh = False
            of = zero
        return oa, ob, oc, oh, of

    return SimpleNamespace(
        compose=compose, apply=apply, identity_map=identity_map, reset_map=reset_map, phys=phys,
        seg_bound=seg_bound, boundary=boundary, carry_in=carry_in, elem=elem, find_seg=find_seg,
        start_state=start_state, write_map=write_map, read_map=read_map, shfl_map=shfl_map)
