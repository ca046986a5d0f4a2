"""The row-resident driver of the CUDA kernels (``MODE_ROWS``).

A block per row group: block ``b`` owns rows ``b*RW .. b*RW+RW-1`` and walks
their tiles from the end of time to the start, carrying each row's state
``(A, Vn)`` from tile to tile in registers (thread ``(x, 0)``'s, replicated
in every thread of row ``x``).  Per tile the threads form their maps, the
block scans them (:mod:`gaescan.kernels.cuda_tile`), each thread applies the
later threads' composition to the carried state and emits its steps, and the
carry moves past the whole tile.  No block waits for another: this driver
suits many rows, or rows of one tile.

With ``OPT_PREFETCH`` a thread issues the loads of its steps in the *next*
tile before this tile's scan, into a second set of per-thread arrays, so the
block's loads are in flight while it scans (a few blocks per SM must
otherwise wait out the memory latency once per tile).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import cuda

from .cuda_spec import KernelSpec
from .cuda_tile import Inputs, Outputs, Params, Place, Steps


def build_rows(spec: KernelSpec, maps: SimpleNamespace, tile_fns: SimpleNamespace):
    """The row-resident kernel of ``spec`` (its ``mode`` is ``MODE_ROWS``).

    Parameters
    ----------
    spec : KernelSpec
        The kernel's compile-time parameters.
    maps : types.SimpleNamespace
        The map functions of the same spec (:func:`~gaescan.kernels.cuda_maps.build_maps`).
    tile_fns : types.SimpleNamespace
        The tile functions of the same spec (:func:`~gaescan.kernels.cuda_tile.build_tile`).

    Returns
    -------
    numba.cuda.dispatcher.CUDADispatcher
        The lazily compiled kernel, with the launch parameters of every gaescan scan kernel.
    """
    K = spec.k
    NSH = spec.nsh
    NF = spec.nf
    NBT = spec.nbt
    TB_LEN = spec.tb_len
    TB2_LEN = spec.tb2_len
    PREFETCH = spec.prefetch
    apply, read_map, identity_map, start_state = maps.apply, maps.read_map, maps.identity_map, maps.start_state
    span, load, fold = tile_fns.span, tile_fns.load, tile_fns.fold
    thread_map, emit, block_suffix_scan = tile_fns.thread_map, tile_fns.emit, tile_fns.block_suffix_scan
    warp_ys, warp_mask = tile_fns.warp_ys, tile_fns.warp_mask

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
        # PREFETCH: the next tile's staged steps (loads in flight during this tile's scan).
        pok = cuda.local.array(K, np.bool_)
        prs = cuda.local.array(K, np.bool_)
        pea = cuda.local.array(K, NBT)
        peb = cuda.local.array(K, NBT)
        pec = cuda.local.array(K, NBT)
        pev = cuda.local.array(K, NBT)
        prv = cuda.local.array(K, NBT)
        prq = cuda.local.array(K, NBT)
        st = Steps(ok, ea, eb, ec, ev, rs, rv, rq)
        pst = Steps(pok, pea, peb, pec, pev, prs, prv, prq)
        # The warps' aggregates of the block scan.
        sh_agg = cuda.shared.array((NF, NSH), NBT)
        x = cuda.threadIdx.x
        y = cuda.threadIdx.y
        tile = TW * K
        ntiles = (T + tile - 1) // tile
        row = cuda.blockIdx.x * RW + x
        live = row < R
        rr = row if live else 0
        inp = Inputs(r, v, nv, term, trunc, mask, g, lm, lv, cu)
        prm = Params(g_s, l_s, lv_s, opts, T, nseg)
        pl = Place(rr, live, x, y, RW, TW, warp_ys(RW, TW), warp_mask(x, y, RW, TW))
        outs = Outputs(out1, out2, sh_tb1, sh_tb2)
        A, Vn = start_state(inp, prm, rr)
        ti = ntiles - 1
        if PREFETCH and live:
            u0, u1 = span(ti, y, tile, T)
            load(rr, u0, u1, inp, prm, pst)
        while ti >= 0:
            u0, u1 = span(ti, y, tile, T)
            if PREFETCH:
                for j in range(K):
                    ok[j] = pok[j]
                    rs[j] = prs[j]
                    ea[j] = pea[j]
                    eb[j] = peb[j]
                    ec[j] = pec[j]
                    ev[j] = pev[j]
                    rv[j] = prv[j]
                    rq[j] = prq[j]
                if live and ti > 0:
                    # Issued here, used in the next iteration: the GPU waits for a load
                    # only where its value is used, so they overlap this tile.
                    n0, n1 = span(ti - 1, y, tile, T)
                    load(rr, n0, n1, inp, prm, pst)
                if live:
                    ma, mb, mc, mh, mf = fold(st)
                else:
                    ma, mb, mc, mh, mf = identity_map()
            else:
                ma, mb, mc, mh, mf = thread_map(pl, u0, u1, inp, prm, st)
            block_suffix_scan(sh, sh_agg, pl, ma, mb, mc, mh, mf)
            if y + 1 < TW:
                xa, xb, xc, xh, xf = read_map(sh, (y + 1) * RW + x)
                cA, cV = apply(xa, xb, xc, xh, xf, A, Vn)
            else:
                cA, cV = A, Vn
            ta, tb, tc, th, tf = read_map(sh, x)
            A, Vn = apply(ta, tb, tc, th, tf, A, Vn)
            emit(pl, ti * tile, u0, u1, prm, st, cA, cV, outs)
            ti -= 1

    return kernel
