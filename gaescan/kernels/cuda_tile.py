"""A tile of the CUDA kernels: load, fold, block scan, emit.

A tile is ``RW`` rows x ``TW * K`` steps; thread ``(x, y)`` owns row ``x`` and
the ``K`` consecutive steps ``y*K .. y*K+K-1`` of the tile (``span``).
:func:`build_tile` compiles, for one
:class:`~gaescan.kernels.cuda_spec.KernelSpec` and the map functions of
:func:`~gaescan.kernels.cuda_maps.build_maps`, the device functions both
drivers run per tile:

1. ``thread_map``: the map of a thread's ``K`` steps.  ``load`` forms each
   step's map into per-thread arrays (with ``OPT_VECTOR`` from 16-byte loads,
   ``vec_put``), ``fold`` composes them, latest step first.
2. ``block_suffix_scan``: a suffix scan over ``y`` of the threads' maps, warp
   shuffles inside a warp (``warp_ys`` time-threads of a row per warp, lanes
   ``warp_mask``), then the warps' aggregates through shared memory.
3. ``emit``: each thread re-runs its ``K`` steps concretely from the state
   entering them and writes the outputs, through the staging buffers (slot
   ``spos(i)``) where a warp holds several time-threads of a row, so that the
   stores are coalesced (with ``OPT_VECTOR`` as 16-byte stores, ``vec_get``).

Every lane of a warp must call ``block_suffix_scan`` and ``emit``.

The device functions take the named structures of this module
(:class:`Inputs`, :class:`Params`, :class:`Place`, :class:`Outputs`,
:class:`Steps`); each driver builds them once per kernel from its launch
parameters.
"""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import numpy as np
from numba import cuda

from .cuda_spec import GAE_NEXT, GAE_V, KernelSpec
from .cuda_vector import ldg_vec, stg_vec

Inputs = namedtuple("Inputs", "r v nv term trunc mask g lm lv cu")
Inputs.__doc__ = """A kernel's input arrays, as launched: rewards (or the scan's ``b``) ``r``,
values ``v``, next values ``nv``, terminations ``term``, truncations
``trunc``, ``mask``, per-step gammas (or the scan's ``a``) ``g`` and lambdas
``lm``, boundary values ``lv`` (``lv[nseg + s]``: the advantage past sequence
``s`` with ``OPT_LAARR``) and packed offsets ``cu``.  An input the call does
not have is a one-element placeholder that the option bits never let a
kernel read."""

Params = namedtuple("Params", "g_s l_s lv_s opts T nseg")
Params.__doc__ = """A kernel's scalar parameters: the scalar gamma ``g_s``, lambda ``l_s`` and
boundary value ``lv_s`` (used where ``opts`` has no per-step or per-row array
for them), the runtime option bits ``opts``, the row length ``T`` and the
number of sequences ``nseg``."""

Place = namedtuple("Place", "row live x y RW TW yw wmask")
Place.__doc__ = """A thread's place in its block: it owns row ``row`` (0 for a row past ``R``,
where ``live`` is false) as thread ``(x, y)`` of a block of ``RW`` rows x
``TW`` time-threads, with ``yw`` time-threads of a row per warp
(``warp_ys``) and the lanes ``wmask`` of its warp that exist (``warp_mask``)."""

Outputs = namedtuple("Outputs", "out1 out2 tb1 tb2")
Outputs.__doc__ = """Where :func:`emit` writes: the output arrays ``out1`` (advantages, returns
or ``y``) and ``out2`` (GAE's returns), and their shared-memory staging
buffers ``tb1`` and ``tb2``."""

Steps = namedtuple("Steps", "ok ea eb ec ev rs rv rq")
Steps.__doc__ = """A thread's staged steps: ``K``-long per-thread arrays (registers), step ``j``
of the thread's ``K``.  ``ok[j]``: the step is valid (inside the row, its
segment, and unmasked), with the map ``(ea, eb, ec)`` and value ``ev``;
``rs[j]``: the state restarts (segment end) before step ``j`` is applied,
with restart value ``rv[j]`` and carry ``rq[j]``.  The kernels allocate the
arrays and build one ``Steps`` per set (the prefetching kernel has two)."""


def build_tile(spec: KernelSpec, maps: SimpleNamespace) -> SimpleNamespace:
    """The tile device functions of the kernel ``spec``.

    Parameters
    ----------
    spec : KernelSpec
        The kernel's compile-time parameters.
    maps : types.SimpleNamespace
        The map functions of the same spec (:func:`~gaescan.kernels.cuda_maps.build_maps`).

    Returns
    -------
    types.SimpleNamespace
        The device functions, by name (see the module docstring).
    """
    KIND = spec.kind
    FWD = spec.fwd
    K = spec.k
    CAST = spec.cast
    NBT = spec.nbt
    PACKED = spec.packed
    DIRECT_V = spec.direct_v
    GAE = spec.gae
    VECTOR = spec.vector
    VW = spec.vw
    VK = spec.vk
    compose, apply = maps.compose, maps.apply
    identity_map, reset_map = maps.identity_map, maps.reset_map
    phys, elem, boundary, carry_in = maps.phys, maps.elem, maps.boundary, maps.carry_in
    seg_bound, find_seg = maps.seg_bound, maps.find_seg
    write_map, read_map, shfl_map = maps.write_map, maps.read_map, maps.shfl_map


    @cuda.jit(device=True)
    def spos(i):
        # One padding slot per 32 elements: a thread's K consecutive slots and
        # the lanes' strided slots both fall in distinct banks.
        return i + i // 32

    # OPT_VECTOR: one 16-byte access's VW elements to and from per-step slots, in
    # logical step order (forward scans: physical time runs the other way).
    if VW == 4:
        @cuda.jit(device=True)
        def vec_put(buf, j, xs):
            # Steps j .. j+3 of buf from the VW elements one load read.
            if FWD:
                buf[0, j], buf[0, j + 1], buf[0, j + 2], buf[0, j + 3] = xs[3], xs[2], xs[1], xs[0]
            else:
                buf[0, j], buf[0, j + 1], buf[0, j + 2], buf[0, j + 3] = xs[0], xs[1], xs[2], xs[3]

        @cuda.jit(device=True)
        def vec_get(buf, s):
            # The VW elements one store writes, from the staging slots of steps s .. s+3.
            a = buf[0, spos(s)]
            b = buf[0, spos(s + 1)]
            c = buf[0, spos(s + 2)]
            d = buf[0, spos(s + 3)]
            if FWD:
                return d, c, b, a
            return a, b, c, d
    else:
        @cuda.jit(device=True)
        def vec_put(buf, j, xs):
            if FWD:
                buf[0, j], buf[0, j + 1] = xs[1], xs[0]
            else:
                buf[0, j], buf[0, j + 1] = xs[0], xs[1]

        @cuda.jit(device=True)
        def vec_get(buf, s):
            a = buf[0, spos(s)]
            b = buf[0, spos(s + 1)]
            if FWD:
                return b, a
            return a, b

    @cuda.jit(device=True)
    def load(row, u_lo, u_hi, inp, prm, steps):
        """Stage the maps of steps u_lo .. u_lo+K-1 (those < u_hi) in per-thread arrays.

        K is a compile-time constant, so the loop unrolls and the arrays live in
        registers; the loads of all K steps are independent of the scan chain and
        are issued back to back.  ``rs[j]``: the state restarts (segment end)
        before step j is applied; ``rv[j]`` is the restart value.
        With ``OPT_VECTOR`` the float inputs of the ``K`` steps (rewards, values,
        next values) are read ``VW`` at a time with 16-byte loads into per-thread
        arrays first (the backend checked the layout: ``T``, ``K`` and each
        thread's first step are multiples of ``VW``, so a group is wholly inside
        ``[u_lo, u_hi)`` or wholly outside); each step then reads them where it
        would read the arrays.  Flags, per-step coefficients and the value after
        the last step are read as elements.  ``steps`` (:class:`Steps`) receives
        the maps.  ``inp`` (:class:`Inputs`) and ``prm`` (:class:`Params`)
        are the kernel's arguments.
        """
        ok, ea, eb, ec, ev, rs, rv, rq = steps
        T = prm.T
        nseg = prm.nseg
        cu = inp.cu
        zero = CAST(0)
        packed = PACKED
        xr = cuda.local.array((1, VK), NBT)
        xv = cuda.local.array((1, VK), NBT)
        xn = cuda.local.array((1, VK), NBT)
        if VECTOR:
            for q in range(K // VW):
                ub = u_lo + q * VW
                if ub < u_hi:
                    # Reverse time: steps ub .. ub+VW-1 are physical ub ..; forward: the
                    # same VW elements from phys(ub+VW-1) on, in reverse order.
                    tb = phys(ub + VW - 1, T) if FWD else ub
                    vec_put(xr, q * VW, ldg_vec(inp.r, row, tb))
                    if GAE:
                        vec_put(xv, q * VW, ldg_vec(inp.v, row, tb))
                    if KIND == GAE_NEXT:
                        vec_put(xn, q * VW, ldg_vec(inp.nv, row, tb))
        s = -1
        seg_lo = 0
        seg_hi = 0
        if packed and u_hi > u_lo:
            s = find_seg(cu, nseg, u_lo, T)
            if s >= 0:
                seg_lo = seg_bound(cu, s, T)
                seg_hi = seg_bound(cu, s + 1, T)
        for j in range(K):
            u = u_lo + j
            ok[j] = False
            rs[j] = False
            rv[j] = zero
            rq[j] = zero
            ea[j] = zero
            eb[j] = zero
            ec[j] = zero
            ev[j] = zero
            if u < u_hi:
                inside = True
                if packed:
                    # Advance to the segment holding u (skipping empty ones).
                    while s + 1 < nseg and u >= seg_hi:
                        s += 1
                        seg_lo = seg_bound(cu, s, T)
                        seg_hi = seg_bound(cu, s + 1, T)
                    if s < 0 or u < seg_lo or u >= seg_hi:
                        inside = False
                    elif u == seg_hi - 1:
                        rs[j] = True
                        rv[j] = boundary(inp, prm, s)
                        if KIND == GAE_V or KIND == GAE_NEXT:
                            rq[j] = carry_in(inp, prm, s)
                if inside:
                    t = phys(u, T)
                    if VECTOR:
                        valid, a_, b_, c_, v_ = elem(row, t, (xr, xv, xn), 0, j, inp, prm, KIND == GAE_NEXT)
                    else:
                        valid, a_, b_, c_, v_ = elem(row, t, (inp.r, inp.v, inp.nv), row, t, inp, prm, False)
                    ok[j] = valid
                    ea[j] = a_
                    eb[j] = b_
                    ec[j] = c_
                    ev[j] = v_
        if DIRECT_V:
            # delta_t = (r_t - v_t) + gamma_t * V', V' the value after step t: the
            # next staged value, the segment's or row's boundary value, or (last
            # staged step) one more load.  A zero gamma (termination) skips the
            # product, so a NaN after an episode end stays there.
            for j in range(K):
                u = u_lo + j
                if ok[j] and eb[j] != zero:
                    if packed and rs[j]:
                        vn = rv[j]
                    elif u + 1 >= T:
                        vn = boundary(inp, prm, row)
                    elif j + 1 < K:
                        vn = ev[j + 1]
                    else:
                        vn = CAST(inp.v[row, phys(u + 1, T)])
                    ec[j] = cuda.fma(eb[j], vn, ec[j])

    @cuda.jit(device=True)
    def fold(steps):
        """Compose the staged maps (:class:`Steps`), latest step first."""
        ok, ea, eb, ec, ev, rs, rv, rq = steps
        ma, mb, mc, mh, mf = identity_map()
        for jj in range(K):
            j = K - 1 - jj
            if rs[j]:
                ra, rb, rc, rh, rf = reset_map(rv[j], rq[j])
                ma, mb, mc, mh, mf = compose(ra, rb, rc, rh, rf, ma, mb, mc, mh, mf)
            if ok[j]:
                ma, mb, mc, mh, mf = compose(ea[j], eb[j], ec[j], True, ev[j], ma, mb, mc, mh, mf)
        return ma, mb, mc, mh, mf

    @cuda.jit(device=True)
    def thread_map(pl, u_lo, u_hi, inp, prm, steps):
        # The map of this thread's steps of the tile (the identity for a row past R).
        if not pl.live:
            return identity_map()
        load(pl.row, u_lo, u_hi, inp, prm, steps)
        return fold(steps)

    @cuda.jit(device=True)
    def emit(pl, ut, u_lo, u_hi, prm, steps, A, Vn, outs):
        """Run the staged steps concretely from state (A, Vn) and write the outputs.

        Every lane of the warp must call this.  With ``yw > 1`` time-threads of a
        row in a warp, those ``yw`` threads own ``yw*K`` consecutive steps: the
        values pass through shared memory (``outs.tb1``, ``outs.tb2``) and are
        stored ``yw`` consecutive steps at a time, so the global stores are
        coalesced (one thread's ``K`` consecutive steps would hit ``K``
        different sectors per store instruction).  ``pl`` (:class:`Place`) is
        the thread's place, ``ut`` the tile's first step, ``[u_lo, u_hi)`` the
        thread's steps, ``steps`` (:class:`Steps`) the maps :func:`load`
        staged, ``outs`` (:class:`Outputs`) where they go.
        """
        ok, ea, eb, ec, ev, rs, rv, rq = steps
        row, live, x, y, RW, yw, wmask = pl.row, pl.live, pl.x, pl.y, pl.RW, pl.yw, pl.wmask
        out1, out2, tb1, tb2 = outs
        T = prm.T
        zero = CAST(0)
        two = KIND == GAE_V or KIND == GAE_NEXT
        yl = y % yw
        slot0 = ((y // yw) * RW + x) * (yw * K)  # this row's slots in the warp's part of tb
        if live:
            for jj in range(K):
                j = K - 1 - jj
                u = u_lo + j
                if u < u_hi:
                    o1 = zero
                    o2 = zero
                    sl = spos(slot0 + yl * K + j)
                    if rs[j]:
                        ra, rb, rc, rh, rf = reset_map(rv[j], rq[j])
                        A, Vn = apply(ra, rb, rc, rh, rf, A, Vn)
                    if ok[j]:
                        A, Vn = apply(ea[j], eb[j], ec[j], True, ev[j], A, Vn)
                        o1 = A
                        if two:
                            o2 = A + ev[j]
                    if yw > 1:
                        tb1[0, sl] = o1
                        if two:
                            tb2[0, sl] = o2
                    else:
                        t = phys(u, T)
                        out1[row, t] = o1
                        if two:
                            out2[row, t] = o2
        if yw > 1:
            cuda.syncwarp(wmask)
            if live:
                ug = ut + (y // yw) * (yw * K)  # first step of the yw threads' run
                if VECTOR:
                    # 16-byte stores, lane yl at steps VW*yl .. of each yw*VW-step run: still
                    # consecutive lanes at consecutive addresses.  T and the run's start are
                    # multiples of VW, so a group is wholly inside the row or wholly past it.
                    for i in range(K // VW):
                        e = (i * yw + yl) * VW
                        u = ug + e
                        if u < T:
                            tb = phys(u + VW - 1, T) if FWD else u
                            stg_vec(out1, row, tb, vec_get(tb1, slot0 + e))
                            if two:
                                stg_vec(out2, row, tb, vec_get(tb2, slot0 + e))
                else:
                    for i in range(K):
                        e = i * yw + yl
                        u = ug + e
                        if u < T:
                            t = phys(u, T)
                            out1[row, t] = tb1[0, spos(slot0 + e)]
                            if two:
                                out2[row, t] = tb2[0, spos(slot0 + e)]
            # No trailing syncwarp: tb is next written after the next block scan's barrier.
        return A, Vn

    @cuda.jit(device=True)
    def warp_mask(x, y, RW, TW):
        """The lanes of this thread's warp that exist (a block of fewer than 32
        threads, e.g. for a very short row, has a partial warp)."""
        n = RW * TW - ((x + y * RW) // 32) * 32
        if n >= 32:
            return np.uint32(0xFFFFFFFF)
        return np.uint32((1 << n) - 1)

    @cuda.jit(device=True)
    def warp_ys(RW, TW):
        """Time-threads of one row per warp: thread (x, y) is lane (x + y*RW) % 32."""
        yw = 1
        if 32 % RW == 0:
            yw = 32 // RW
        if yw > TW:
            yw = TW
        return yw

    @cuda.jit(device=True)
    def block_suffix_scan(sh, agg, pl, ma, mb, mc, mh, mf):
        """Inclusive suffix scan over y of the threads' maps; leaves the results in sh.

        Thread ``(x, y)`` is lane ``(x + y*RW) % 32``: when ``RW`` divides 32, a
        warp holds ``yw`` (``warp_ys``: 32/RW, at most TW) consecutive y of every
        row x, scanned with shuffles (no barrier) over the lanes of ``wmask``;
        the warps' aggregates then meet in shared memory, each thread folding in
        those of the later warps in time order (a fixed association: results do
        not depend on timing).  Two block barriers.  ``pl``: the thread's
        :class:`Place`.
        """
        x, y, RW, TW, yw, wmask = pl.x, pl.y, pl.RW, pl.TW, pl.yw, pl.wmask
        yl = y % yw
        d = 1
        while d < yw:
            oa, ob, oc, oh, of = shfl_map(wmask, ma, mb, mc, mh, mf, d * RW)
            if yl + d < yw and y + d < TW:
                ma, mb, mc, mh, mf = compose(ma, mb, mc, mh, mf, oa, ob, oc, oh, of)
            d *= 2
        gy = y // yw
        if yl == 0:
            write_map(agg, gy * RW + x, ma, mb, mc, mh, mf)
        # Also orders this tile's writes of sh after every thread's reads of the last tile's.
        cuda.syncthreads()
        ng = (TW + yw - 1) // yw
        gg = gy + 1
        while gg < ng:
            oa, ob, oc, oh, of = read_map(agg, gg * RW + x)
            ma, mb, mc, mh, mf = compose(ma, mb, mc, mh, mf, oa, ob, oc, oh, of)
            gg += 1
        write_map(sh, y * RW + x, ma, mb, mc, mh, mf)
        cuda.syncthreads()

    @cuda.jit(device=True)
    def span(ti, y, tile, T):
        # Thread y's steps [u0, u1) of tile ti.
        u0 = ti * tile + y * K
        u1 = u0 + K
        if u1 > T:
            u1 = T
        if u0 > T:
            u0 = T
        return u0, u1

    return SimpleNamespace(
        spos=spos, vec_put=vec_put, vec_get=vec_get, load=load, fold=fold, thread_map=thread_map,
        emit=emit, warp_mask=warp_mask, warp_ys=warp_ys, block_suffix_scan=block_suffix_scan, span=span)
