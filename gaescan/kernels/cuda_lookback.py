"""The look-back driver of the CUDA kernels (``MODE_LOOKBACK``), and its fast variant.

A block per tile (and row group).  Tiles are handed out by an atomic ticket
counter in reverse time order (``c_rev = 0`` is the last tile), so a block
only ever waits for blocks that started before it; this is also why the
driver runs in the simulator, which runs blocks one after another.  Per block:

1. the ticket: the tile ``ti`` and row group ``grp`` this block scans;
2. the tile's maps and block scan (:mod:`gaescan.kernels.cuda_tile`);
3. publish: each row's tile map goes to the group's record in ``pub``, then
   its flag (``FLAG_AGG``) is raised in ``flg``;
4. look back, phase 1: the ``TW`` threads of a row poll ``TW`` flags of later
   tiles at once, until each row finds the nearest later tile whose state is
   published (``FLAG_INCL``);
5. phase 2: the maps of the tiles in between, prefetched into shared memory
   ``TW`` at a time, are applied *one by one, in time order*, to that state;
   the state leaving this tile is published, then its flag raised;
6. emit: each thread applies the later threads' composition to the state
   entering the tile and writes its steps.

The state every block computes for a tile is therefore the same sequence of
floating-point operations however far the look-back went: results are
bit-identical run after run (the look-back only changes who does the work).

Look-back records (one per tile and row group, see
:func:`gaescan.kernels.cuda.group_record`) keep the maps and the states of the
group's rows in separate 128-byte-aligned sections; each section is fully
written (then ``threadfence`` and a block barrier) before any of its rows'
flags is raised, and read only after its flag is seen (flags are read with
atomics): no stale L1 line can be hit.

``OPT_FASTLB`` (one-row blocks, float32 ``(alpha, c)`` maps): a tile's record
is three 64-bit words in ``lbw`` (``lb_word``: alpha, c, state), each a flag
in its high half and a float32 in its low half (``lb_pack``, ``lb_flag``,
``lb_value``), written with one atomic exchange and read with atomics
(``lb_read``).  A flag is never seen without its value, so no memory fence is
needed; warp 0 polls 32 tiles per round (``ballot_sync``, ``lowest_lane``),
backs off (``nanosleep``) after a round that finds nothing new, and hands the
maps out with ``shfl_sync`` (``fast_lookback``), with one block barrier after
the look-back instead of several per round.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import cuda
from numba.core import config as _numba_config

from .cuda_spec import (
    BACKOFF_MAX_NS,
    BACKOFF_MIN_NS,
    FLAG_AGG,
    FLAG_INCL,
    MAP_SLOTS,
    OPT_UNPUBLISHED,
    KernelSpec,
)
from .cuda_tile import Inputs, Outputs, Params, Place, Steps

if _numba_config.ENABLE_CUDASIM:
    from ._cudasim import bits_f32, f32_bits
else:
    from numba.cuda.libdevice import float_as_int as f32_bits
    from numba.cuda.libdevice import int_as_float as bits_f32


def build_lookback(spec: KernelSpec, maps: SimpleNamespace, tile_fns: SimpleNamespace, parts=None):
    """The look-back kernel of ``spec`` (its ``mode`` is ``MODE_LOOKBACK``).

    Parameters
    ----------
    spec : KernelSpec
        The kernel's compile-time parameters.
    maps : types.SimpleNamespace
        The map functions of the same spec (:func:`~gaescan.kernels.cuda_maps.build_maps`).
    tile_fns : types.SimpleNamespace
        The tile functions of the same spec (:func:`~gaescan.kernels.cuda_tile.build_tile`).
    parts : dict, optional
        Receives the fast look-back's device functions (``fast_lookback``,
        ``lb_pack``, ``lb_word``, ``apply``): tests drive the fast look-back
        against a concurrent publisher in the simulator.

    Returns
    -------
    numba.cuda.dispatcher.CUDADispatcher
        The lazily compiled kernel, with the launch parameters of every gaescan scan kernel.
    """
    K = spec.k
    NSH = spec.nsh
    NF = spec.nf
    CAST = spec.cast
    NBT = spec.nbt
    LINE = spec.line
    TB_LEN = spec.tb_len
    TB2_LEN = spec.tb2_len
    FASTLB = spec.fastlb
    apply, read_map, write_map, start_state = maps.apply, maps.read_map, maps.write_map, maps.start_state
    span, thread_map, emit = tile_fns.span, tile_fns.thread_map, tile_fns.emit
    block_suffix_scan, warp_ys, warp_mask = tile_fns.block_suffix_scan, tile_fns.warp_ys, tile_fns.warp_mask

    @cuda.jit(device=True)
    def lb_word(j, R, rr, f):
        # Word f of the fast look-back record of tile j (scan order) of row rr;
        # word 0 is the ticket counter.  f = 0: alpha, 1: c (FLAG_AGG), 2: state (FLAG_INCL).
        return 1 + 3 * (j * R + rr) + f

    @cuda.jit(device=True)
    def lb_pack(flag, val):
        return (np.uint64(flag) << np.uint64(32)) | (np.uint64(f32_bits(val)) & np.uint64(0xFFFFFFFF))

    @cuda.jit(device=True)
    def lb_flag(w):
        return w >> np.uint64(32)

    @cuda.jit(device=True)
    def lb_value(w):
        return bits_f32(np.int32(w & np.uint64(0xFFFFFFFF)))

    @cuda.jit(device=True)
    def lb_read(lbw, i):
        # An L2 read (never a stale L1 line) of one whole word.
        return cuda.atomic.add(lbw, i, np.uint64(0))

    @cuda.jit(device=True)
    def lowest_lane(m):
        # The lowest lane set in a ballot; 32 when none is.
        return np.int64(cuda.clz(cuda.brev(np.uint32(m))))

    @cuda.jit(device=True)
    def fast_lookback(lbw, y, TW, R, rr, c_rev):
        """The state entering tile ``c_rev`` (scan order) of row ``rr``, by warp 0 of a one-row block.

        Each record word holds a flag and a float32 together, so one atomic
        write publishes both: no fence, and a reader sees a value only with
        its flag.  The warp polls 32 later tiles at once and finds the
        nearest one whose state is published with only published maps in
        between; it then applies those maps one by one, in time order (a
        shuffle hands them out), as the general look-back does: the same
        floating-point operations, so the same bits.  The state and the maps
        polled in the last round are applied from the words the poll read (a
        word is written once): only maps found in earlier rounds are read again.
        A round that finds the nearest tile still unpublished backs off before
        polling again (``nanosleep``, doubling from ``BACKOFF_MIN_NS`` up to
        ``BACKOFF_MAX_NS``; any progress starts the doubling again), so that
        waiting warps leave the memory system and the SM's issue slots to the
        blocks they wait for.  No block barrier is inside the loop.
        """
        zero = CAST(0)
        wm = warp_mask(0, y, 1, TW)
        wl = TW if TW < 32 else 32
        jb = c_rev - 1  # the latest tile not yet known to hold a map
        fi = np.int64(0)
        delay = np.uint32(BACKOFF_MIN_NS)
        ls = zero
        la = CAST(1)
        lc = zero
        searching = True
        while searching:
            j = jb - y
            st = 0
            ls = zero
            la = CAST(1)
            lc = zero
            if j < 0:
                st = FLAG_INCL  # never the nearest: tile 0 publishes a state, never a map
            else:
                w = lb_read(lbw, lb_word(j, R, rr, 2))
                if lb_flag(w) == np.uint64(FLAG_INCL):
                    st = FLAG_INCL
                    ls = lb_value(w)
                else:
                    w = lb_read(lbw, lb_word(j, R, rr, 0))
                    if lb_flag(w) == np.uint64(FLAG_AGG):
                        la = lb_value(w)
                        w = lb_read(lbw, lb_word(j, R, rr, 1))
                        if lb_flag(w) == np.uint64(FLAG_AGG):
                            lc = lb_value(w)
                            st = FLAG_AGG
            fi = lowest_lane(cuda.ballot_sync(wm, st == FLAG_INCL))
            fn = lowest_lane(cuda.ballot_sync(wm, st == 0))
            if fi < fn:
                searching = False
            elif fn == 0:
                # The nearest tile is unpublished: nothing to take from this round.
                cuda.nanosleep(delay)
                if delay < BACKOFF_MAX_NS:
                    delay = np.uint32(delay * 2)
            elif fn < 32:
                jb -= fn  # maps up to there: poll again from the first unpublished tile
                delay = np.uint32(BACKOFF_MIN_NS)
            else:
                jb -= wl
                delay = np.uint32(BACKOFF_MIN_NS)
        # Lane fi holds the state of tile jb - fi; lanes fi - 1 .. 0 the maps of the
        # tiles after it, up to jb, in time order.
        A = cuda.shfl_sync(wm, ls, fi)
        Vn = zero
        i = fi - 1
        while i >= 0:
            ia = cuda.shfl_sync(wm, la, i)
            ic = cuda.shfl_sync(wm, lc, i)
            A, Vn = apply(ia, zero, ic, False, zero, A, Vn)
            i -= 1
        j0 = jb + 1
        while j0 < c_rev:
            j = j0 + y
            la = CAST(1)
            lc = zero
            if j < c_rev:
                la = lb_value(lb_read(lbw, lb_word(j, R, rr, 0)))
                lc = lb_value(lb_read(lbw, lb_word(j, R, rr, 1)))
            n = c_rev - j0
            if n > wl:
                n = wl
            i = 0
            while i < n:
                ia = cuda.shfl_sync(wm, la, i)
                ic = cuda.shfl_sync(wm, lc, i)
                A, Vn = apply(ia, zero, ic, False, zero, A, Vn)
                i += 1
            j0 += n
        return A, Vn

    @cuda.jit
    def kernel(r, v, nv, term, trunc, mask, g, lm, lv, cu, out1, out2,
               g_s, l_s, lv_s, opts, R, T, nseg, RW, TW, pub, flg, lbw):
        sh = cuda.shared.array((NF, NSH), NBT)
        sh_tb1 = cuda.shared.array((1, TB_LEN), NBT)
        sh_tb2 = cuda.shared.array((1, TB2_LEN), NBT)
        ok = cuda.local.array(K, np.bool_)
        rs = cuda.local.array(K, np.bool_)
        ea = cuda.local.array(K, NBT)
        eb = cuda.local.array(K, NBT)
        ec = cuda.local.array(K, NBT)
        ev = cuda.local.array(K, NBT)
        rv = cuda.local.array(K, NBT)
        rq = cuda.local.array(K, NBT)
        st = Steps(ok, ea, eb, ec, ev, rs, rv, rq)
        sh_state = cuda.shared.array((2, NSH), NBT)
        sh_tk = cuda.shared.array(1, np.int64)
        sh_lb = cuda.shared.array((NF, NSH), NBT)
        # The warps' aggregates of the block scan; the look-back's prefetch buffer is
        # only written after the scan's last barrier (and several more), so they share.
        sh_agg = sh_lb
        sh_fl = cuda.shared.array(NSH, np.int32)
        sh_base = cuda.shared.array(NSH, np.int64)
        sh_found = cuda.shared.array(NSH, np.int64)
        sh_ctl = cuda.shared.array(2, np.int64)
        x = cuda.threadIdx.x
        y = cuda.threadIdx.y
        zero = CAST(0)
        tile = TW * K
        ntiles = (T + tile - 1) // tile
        ngroups = (R + RW - 1) // RW
        if x == 0 and y == 0:
            if FASTLB:
                sh_tk[0] = np.int64(cuda.atomic.add(lbw, 0, np.uint64(1)))
            else:
                sh_tk[0] = cuda.atomic.add(flg, 0, 1)
        cuda.syncthreads()
        tk = sh_tk[0]
        c_rev = tk // ngroups  # 0 = last tile in scan order
        grp = tk - c_rev * ngroups
        ti = ntiles - 1 - c_rev
        row = grp * RW + x
        live = row < R
        rr = row if live else 0
        inp = Inputs(r, v, nv, term, trunc, mask, g, lm, lv, cu)
        prm = Params(g_s, l_s, lv_s, opts, T, nseg)
        pl = Place(rr, live, x, y, RW, TW, warp_ys(RW, TW), warp_mask(x, y, RW, TW))
        u0, u1 = span(ti, y, tile, T)
        ma, mb, mc, mh, mf = thread_map(pl, u0, u1, inp, prm, st)
        block_suffix_scan(sh, sh_agg, pl, ma, mb, mc, mh, mf)
        skip = (opts & OPT_UNPUBLISHED) != 0 and c_rev % 16 != 0
        if FASTLB:
            # One row per block (RW = 1): warp 0 publishes and looks back.
            if y < 32:
                if c_rev > 0:
                    if y == 0:
                        ta, tb, tc, th, tf = read_map(sh, 0)
                        cuda.atomic.exch(lbw, lb_word(c_rev, R, rr, 0), lb_pack(FLAG_AGG, ta))
                        cuda.atomic.exch(lbw, lb_word(c_rev, R, rr, 1), lb_pack(FLAG_AGG, tc))
                    A, Vn = fast_lookback(lbw, y, TW, R, rr, c_rev)
                else:
                    A, Vn = start_state(inp, prm, rr)
                if y == 0:
                    sh_state[0, 0] = A
                    sh_state[1, 0] = Vn
                    if not skip:
                        ta, tb, tc, th, tf = read_map(sh, 0)
                        nA, nV = apply(ta, tb, tc, th, tf, A, Vn)
                        cuda.atomic.exch(lbw, lb_word(c_rev, R, rr, 2), lb_pack(FLAG_INCL, nA))
            cuda.syncthreads()
        else:
            # Publish this tile's map (row x), then look back cooperatively: the
            # TW threads of row x read TW flags of later tiles at once.
            need = live and c_rev > 0
            rec = c_rev * R + rr
            mapw = (RW * MAP_SLOTS + LINE - 1) // LINE * LINE
            grec = mapw + (RW * 2 + LINE - 1) // LINE * LINE
            gbase = (c_rev * ngroups + grp) * grec
            base = gbase + x * MAP_SLOTS
            ibase = gbase + mapw + x * 2
            A = zero
            Vn = zero
            if y == 0:
                if need:
                    ta, tb, tc, th, tf = read_map(sh, x)
                    pub[base + 0] = ta
                    pub[base + 1] = tb
                    pub[base + 2] = tc
                    pub[base + 3] = CAST(1) if th else zero
                    pub[base + 4] = tf
                    cuda.threadfence()
                sh_base[x] = c_rev - 1
                sh_found[x] = -1 if need else -2
            cuda.syncthreads()
            # Raise the flags only once every row's map of the group is written: a
            # map line is never read before all of it holds its final values.
            if y == 0 and need:
                cuda.atomic.max(flg, 1 + rec, FLAG_AGG)
            # Phase 1: per row, the nearest later tile whose state is published.
            while True:
                fx = sh_found[x]
                bx = sh_base[x]
                jj = bx - y
                f = -1
                if fx == -1 and jj >= 0:
                    f = cuda.atomic.add(flg, 1 + jj * R + rr, 0)
                sh_fl[y * RW + x] = f
                cuda.syncthreads()
                if y == 0 and fx == -1:
                    nb = bx - TW  # the whole window holds maps only: go further back
                    k = 0
                    while k < TW:
                        jk = bx - k
                        if jk < 0:
                            nb = 0
                            break
                        fk = sh_fl[k * RW + x]
                        if fk == FLAG_INCL:
                            sh_found[x] = jk
                            break
                        if fk != FLAG_AGG:
                            nb = jk  # not published yet: poll again from here
                            break
                        k += 1
                    sh_base[x] = nb
                cuda.syncthreads()
                if x == 0 and y == 0:
                    d = 1
                    for xx in range(RW):
                        if sh_found[xx] == -1:
                            d = 0
                    sh_ctl[0] = d
                cuda.syncthreads()
                if sh_ctl[0] == 1:
                    break
            # Phase 2: apply the maps of the tiles in between, in time order, to the
            # published state (prefetched TW at a time into shared memory).
            cuda.threadfence()
            # The thread that saw the state's flag is seldom the one that reads the
            # state: its fence orders that read (PTX memory model) only through a
            # barrier between them.
            cuda.syncthreads()
            fx = sh_found[x]
            if y == 0 and need:
                jb = (fx * ngroups + grp) * grec + mapw + x * 2
                A = pub[jb]
                Vn = pub[jb + 1]
            if x == 0 and y == 0:
                mx = 0
                for xx in range(RW):
                    fxx = sh_found[xx]
                    if fxx >= 0 and c_rev - 1 - fxx > mx:
                        mx = c_rev - 1 - fxx
                sh_ctl[1] = mx
            cuda.syncthreads()
            lmax = sh_ctl[1]
            m0 = 0
            while m0 < lmax:
                m = fx + 1 + m0 + y
                if need and m < c_rev:
                    mbase = (m * ngroups + grp) * grec + x * MAP_SLOTS
                    write_map(sh_lb, y * RW + x, pub[mbase + 0], pub[mbase + 1], pub[mbase + 2],
                              pub[mbase + 3] != zero, pub[mbase + 4])
                cuda.syncthreads()
                if y == 0 and need:
                    k = 0
                    while k < TW and fx + 1 + m0 + k < c_rev:
                        la, lb, lc, lh, lf = read_map(sh_lb, k * RW + x)
                        A, Vn = apply(la, lb, lc, lh, lf, A, Vn)
                        k += 1
                cuda.syncthreads()
                m0 += TW
            if y == 0 and live:
                if c_rev == 0:
                    A, Vn = start_state(inp, prm, rr)
                sh_state[0, x] = A
                sh_state[1, x] = Vn
                ta, tb, tc, th, tf = read_map(sh, x)
                nA, nV = apply(ta, tb, tc, th, tf, A, Vn)
                if not skip:
                    pub[ibase] = nA
                    pub[ibase + 1] = nV
                    cuda.threadfence()
            cuda.syncthreads()
            if y == 0 and live and not skip:
                cuda.atomic.max(flg, 1 + rec, FLAG_INCL)
        if live:
            A = sh_state[0, x]
            Vn = sh_state[1, x]
            if y + 1 < TW:
                xa, xb, xc, xh, xf = read_map(sh, (y + 1) * RW + x)
                A, Vn = apply(xa, xb, xc, xh, xf, A, Vn)
        emit(pl, ti * tile, u0, u1, prm, st, A, Vn, Outputs(out1, out2, sh_tb1, sh_tb2))

    if parts is not None:
        parts.update(fast_lookback=fast_lookback, lb_pack=lb_pack, lb_word=lb_word, apply=apply)
    return kernel
