"""Numba CUDA kernels: one-pass tile scans of ``(R, T)`` rows.

Every problem is run as a *reverse* scan over a logical time index ``u``
(``u = T-1`` first).  GAE and discounted returns are reverse scans of physical
time (``t = u``); the forward ``linear_scan`` reads physical time ``t = T-1-u``
(a compile-time switch, so no negative-stride views are ever built).

The state carried from later to earlier steps is a pair ``(A, Vn)``: the
accumulator (``A_{τ(t)}`` for GAE, ``G`` for returns, ``y`` for the scan) and,
for GAE without ``next_values``, the value ``V`` at the next unmasked position
of the sequence.  A run of steps acts on that state as the map::

    (A, Vn) -> (alpha*A + beta*Vn + c,  Vf if hv else Vn)

so a run is five numbers ``(alpha, beta, c, hv, Vf)``.  Only a mask makes
"the next unmasked value" depend on the data; without one, ``Vn`` at step
``t`` is ``v[t+1]`` (or the boundary value), δ is formed directly when the
steps are loaded, and the map shrinks to the pair ``(alpha, c)`` — as for
GAE with ``next_values``, returns and the linear scan.  A masked step is the
identity, a segment boundary of a packed row the constant map
``(0, 0, A0, 1, last_value[s])``.  Two runs compose as (``M1`` earlier in time,
applied after ``M2``)::

    alpha = alpha1*alpha2
    beta  = alpha1*beta2 + (0 if hv2 else beta1)
    c     = c1 + alpha1*c2 + (beta1*Vf2 if hv2 else 0)
    hv    = hv1 or hv2,   Vf = Vf1 if hv1 else Vf2

Products with ``alpha1 == 0`` / ``beta1 == 0`` are *skipped*, not computed: a
done cut (``alpha = 0``) and a terminal bootstrap (``beta = 0``) are selects,
so a NaN or inf after an episode end never reaches the episode before it.
(A consequence: a zero ``gamma*lam`` inside an episode also stops a NaN, where
a plain multiply would have propagated it.)

A tile is ``RW`` rows x ``TW * K`` steps; thread ``(x, y)`` owns row ``x`` and
the ``K`` consecutive steps ``y*K .. y*K+K-1`` of the tile.  Per tile:

1. each thread composes the maps of its ``K`` steps (serial, in registers);
2. a suffix scan over ``y`` — warp shuffles inside a warp, then the warps'
   aggregates through shared memory — gives every thread the composition of
   the later threads' maps (the simulator, which has no shuffles, gets one
   from :mod:`gaescan.kernels._cudasim`, so it runs this same code);
3. each thread applies that to the tile's carry-in state, then re-runs its
   ``K`` steps concretely; the outputs pass through shared memory so that the
   stores are coalesced (consecutive lanes write consecutive steps).

Two drivers share the tile code:

* ``MODE_ROWS`` — a block per row group walks its rows' tiles from the end,
  carrying the state in registers (many rows, or rows of one tile).
* ``MODE_LOOKBACK`` — a block per tile; tiles are handed out by an atomic
  ticket counter in reverse time order, so a block only ever waits for blocks
  that started before it (this is also why it runs in the simulator, which
  runs blocks one after another).  Each block publishes its tile map, then
  looks back over the maps of later tiles until it finds a published state
  (the ``TW`` threads of a row poll ``TW`` flags at once; the maps in between
  are prefetched into shared memory ``TW`` at a time), and applies those maps
  *one by one, in time order*, to that state.  The
  state every block computes for a tile is therefore the same sequence of
  floating-point operations however far the look-back went: results are
  bit-identical run after run (the look-back only changes who does the work).

Five compile-time variants (tunables ``prefetch``, ``fast_lookback``,
``coalesced_loads``, ``shared_steps`` and ``vector_access`` of the backend; all
give the default kernels' bits):

* ``OPT_PREFETCH`` — in ``MODE_ROWS`` a thread issues the loads of its steps
  in the *next* tile before this tile's scan, so the block's loads are in
  flight while it scans (a few blocks per SM must otherwise wait out the
  memory latency once per tile).
* ``OPT_FASTLB`` — the look-back of one-row blocks with float32 (alpha, c)
  maps: a tile's record is three 64-bit words (alpha, c, state), each holding
  a flag in its high half and a float32 in its low half, written with one
  atomic exchange and read with atomics.  A flag can never be seen without
  its value, so no memory fence is needed; warp 0 polls 32 tiles per round
  (``ballot_sync``), backs off (``nanosleep``) after a round that finds
  nothing new, and hands the maps out with ``shfl_sync``, with one block
  barrier after the look-back instead of several per round.
* ``OPT_CLOAD`` — the loads mirror the stores: a thread's ``K`` consecutive
  steps make each of its float load instructions touch a different 32-byte
  sector from its neighbour's (a warp instruction reads 32 sectors for 128
  bytes and leans on L1 to catch the rest).  Instead, the ``yw`` time-threads
  of a row in a warp read their ``yw*K`` steps of rewards and values (or the
  scan's coefficients) together, consecutive lanes at consecutive steps, into
  the output staging buffers (cast to the compute dtype), and each thread then
  takes its ``K`` steps from there.  Flags (bytes) and next values are read
  as before.  No extra shared memory.
* ``OPT_SHSTEPS`` — the steps stay in those staging buffers from the loads to
  the stores: a thread folds its ``K`` steps from shared memory (each step's
  constant replaces its reward there), and :func:`emit` forms each step again
  from the buffers and the flags, so no per-step arrays are held in registers
  across the block scan and the look-back (GAE look-back: 78 registers instead
  of 111).  Packed rows walk their segments again in emit; every warp layout
  stages.
* ``OPT_VECTOR`` — 16-byte accesses (:mod:`gaescan.kernels.cuda_vector`;
  ``VW`` = 4 float32 or 2 float64 elements): :func:`load` reads a thread's ``K``
  steps of rewards, values and next values ``VW`` at a time with
  ``ld.global.nc`` vector loads into per-thread arrays, and :func:`emit` stores
  the staged outputs ``VW`` consecutive steps per lane with ``st.global``
  vector stores.  Both drivers (the prefetch too); not with ``OPT_CLOAD`` or
  ``OPT_SHSTEPS``, which read through shared memory.  Valid only where every
  array's rows start on 16-byte boundaries, are contiguous along time and
  hold the compute dtype, and ``T`` and ``K`` are multiples of ``VW``: the
  backend checks that on the host (``vector_ok``, ``vector_steps``).  Flags,
  per-step coefficients and boundary values are read as elements.

Look-back records (one per tile and row group, see :func:`group_record`) keep
the maps and the states of the group's rows in separate 128-byte-aligned
sections; each section is fully written (then ``threadfence`` and a block
barrier) before any of its rows' flags is raised, and read only after the
flag was seen (flags are read with atomics): no stale L1 line can be hit.

``cuda`` is a module-level global, as the simulator requires.  Kernels are
compiled lazily (no signatures), on first launch.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.core import config as _numba_config

from .cuda_vector import ldg_vec, stg_vec

#: Numba's CUDA simulator runs the kernels (``NUMBA_ENABLE_CUDASIM=1``, read at import).
SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

if SIMULATOR:
    # The simulator has no warp intrinsics: give it the shuffle the block scan uses.
    from . import _cudasim

    _cudasim.install()
    f32_bits, bits_f32 = _cudasim.f32_bits, _cudasim.bits_f32
else:
    from numba.cuda.libdevice import float_as_int as f32_bits
    from numba.cuda.libdevice import int_as_float as bits_f32

# Problem kinds (compile-time constants of a kernel).
GAE_V = 0  # GAE, bootstrap from the value at the next unmasked position
GAE_NEXT = 1  # GAE with next_values given
RET = 2  # discounted returns
SCAN = 3  # linear scan

MODE_ROWS = 0
MODE_LOOKBACK = 1

# Runtime option bits (one int argument).
OPT_TERM = 1
OPT_TRUNC = 2
OPT_MASK = 4
OPT_GARR = 8
OPT_LARR = 16
OPT_LVARR = 32
OPT_PACKED = 64
OPT_UNPUBLISHED = 128  # test hook: most tiles never publish their state (longer look-backs)
OPT_LAARR = 256  # GAE: lv[nseg + s] holds last_advantage (A past sequence s), else 0
# Compile-time variants (tunables "prefetch", "fast_lookback", "coalesced_loads", "shared_steps";
# see the backend).
OPT_PREFETCH = 512  # MODE_ROWS: the next tile's loads are issued before this tile is scanned
OPT_FASTLB = 1024  # MODE_LOOKBACK, float32, (alpha, c) maps, one row per block: fence-free words
OPT_CLOAD = 2048  # not with OPT_PREFETCH: the warp loads its steps coalesced, through shared memory
OPT_SHSTEPS = 4096  # not with OPT_PREFETCH: a tile's steps stay in shared memory, not registers
OPT_VECTOR = 8192  # not with OPT_CLOAD / OPT_SHSTEPS: 16-byte loads and stores (see vector_ok in the backend)
#: The option bits that select a compiled kernel (the others are runtime switches).
CT_BITS = OPT_MASK | OPT_PACKED | OPT_PREFETCH | OPT_FASTLB | OPT_CLOAD | OPT_SHSTEPS | OPT_VECTOR


def stages_inputs(opts: int, kind: int, rw: int, tw: int) -> bool:
    """Whether a kernel compiled with ``OPT_CLOAD`` stages this launch's inputs.

    Only where a warp holds several time-threads of a row (``warp_ys > 1``: not
    time-major blocks, whose loads are coalesced across rows already) and no
    per-step λ array, nor per-step γ array outside the linear scan (where it is
    ``a``), is read: those would need staging buffers of their own.  The kernel
    applies the same test; the backend uses this one to set the bit only where
    it changes the code that runs.
    """
    yw = 32 // rw if 32 % rw == 0 else 1
    if min(yw, tw) <= 1:
        return False
    return not opts & _unstaged_bits(kind)


def _unstaged_bits(kind: int) -> int:
    # Per-step inputs with no staging buffer: λ arrays, and γ arrays outside the linear scan.
    return OPT_LARR | (0 if kind == SCAN else OPT_GARR)

FLAG_AGG = 1
FLAG_INCL = 2
# The fast look-back's back-off between fruitless polling rounds, in nanoseconds.
BACKOFF_MIN_NS = 32
BACKOFF_MAX_NS = 1024
MAP_SLOTS = 8  # elements per row in a record's map section (5 used)


def group_record(itemsize: int, rw: int) -> tuple[int, int]:
    """Look-back record of one (tile, row group): ``(map section, record)`` lengths in elements.

    The map section holds ``rw`` rows x ``MAP_SLOTS`` fields, the state section
    ``rw`` x 2; each section is padded to whole 128-byte lines, so each line
    is written once (by one block, before the flags of its rows are raised).
    """
    line = 128 // itemsize
    mapw = -(-rw * MAP_SLOTS // line) * line
    incw = -(-rw * 2 // line) * line
    return mapw, mapw + incw


_CACHE: dict = {}


def get_kernel(kind: int, mode: int, fwd: bool, dtype: np.dtype, nsh: int, k: int, opts: int = 0):
    """The (lazily compiled) kernel for a problem kind, driver mode and output dtype.

    Of the option bits, those in :data:`CT_BITS` are compile-time (a mask or
    packed rows cost registers when compiled in; the prefetch and the fast
    look-back are other code); the others are runtime switches.
    """
    ct = opts & CT_BITS
    key = (kind, mode, bool(fwd), np.dtype(dtype).str, nsh, k, ct)
    kern = _CACHE.get(key)
    if kern is None:
        kern = _build(kind, mode, bool(fwd), np.dtype(dtype), nsh, int(k), ct)
        _CACHE[key] = kern
    return kern


def _build(KIND, MODE, FWD, dtype, NSH, K, CT, parts=None):  # noqa: C901 - one kernel, many features
    """Compile-time specialisation of the kernel (see :func:`get_kernel`).

    ``parts``, a dict, receives the look-back's device functions (tests drive the
    fast look-back against a concurrent publisher in the simulator).
    """
    MASKED = bool(CT & OPT_MASK)
    PACKED = bool(CT & OPT_PACKED)
    CAST = np.float32 if dtype == np.float32 else np.float64
    NBT = np.float32 if dtype == np.float32 else np.float64  # numba dtype for shared arrays
    # Without a mask, the value after step t is v[t+1] (or the boundary value):
    # δ is computed directly and the map is the affine pair (alpha, c).  Only a
    # mask (the next *unmasked* value) needs the value carried in the state.
    USE_V = KIND == GAE_V and MASKED
    DIRECT_V = KIND == GAE_V and not MASKED
    NF = 5 if USE_V else 2
    LINE = 128 // dtype.itemsize
    LOOKBACK = MODE == MODE_LOOKBACK
    PREFETCH = bool(CT & OPT_PREFETCH) and not LOOKBACK
    FASTLB = bool(CT & OPT_FASTLB) and LOOKBACK
    if FASTLB and (USE_V or dtype != np.float32):
        raise ValueError("the fast look-back packs a float32 and a flag in one 64-bit word: "
                         "float32 outputs and (alpha, c) maps only (not masked GAE)")
    # Steps kept in shared memory (see fold_shared): always staged, never in registers.
    SHSTEPS = bool(CT & OPT_SHSTEPS)
    if SHSTEPS and PREFETCH:
        # The prefetch holds the next tile's steps in registers, in flight: the backend
        # sets at most one of the two.
        raise ValueError("shared-memory steps and prefetching exclude each other")
    # Coalesced loads (see stage): the float inputs pass through the output buffers.
    CLOAD = (bool(CT & OPT_CLOAD) and not PREFETCH) or SHSTEPS
    # 16-byte loads of a thread's steps and 16-byte stores of the staged outputs (see
    # cuda_vector): VW consecutive elements per access.
    VECTOR = bool(CT & OPT_VECTOR)
    VW = 16 // dtype.itemsize
    if VECTOR and (CLOAD or K % VW):
        raise ValueError(f"16-byte accesses read a thread's steps {VW} at a time from the arrays: they need "
                         f"K={K} to be a multiple of {VW}, and no staged (coalesced or shared-memory) loads")
    VK = K if VECTOR else 1  # length of load's vector-loaded step arrays
    GAE = KIND in (GAE_V, GAE_NEXT)
    NOSTAGE = 0 if SHSTEPS else _unstaged_bits(KIND)  # see stages_inputs
    # Output staging for coalesced stores (see emit): NSH*K slots plus padding.
    # 2-D (one row) so that elem reads staged inputs as it reads the arrays.
    TB_LEN = NSH * K + (NSH * K) // 32 + 1
    TB2_LEN = TB_LEN if GAE or (CLOAD and KIND == SCAN) else 1

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
    def boundary(lv, lv_s, opts, s):
        if opts & OPT_LVARR:
            return CAST(lv[s])
        return lv_s

    @cuda.jit(device=True)
    def carry_in(lv, opts, s, nseg):
        if opts & OPT_LAARR:
            return CAST(lv[nseg + s])
        return CAST(0)

    @cuda.jit(device=True)
    def elem(row, t, srow, st, opts, r, v, nv, term, trunc, mask, g, gs, lm, g_s, l_s, ns):
        # r and v at [srow, st] (staged in shared memory by stage, vector-loaded by
        # load, or the arrays' [row, t]), g there too if gs (the scan's staged a),
        # next values there too if ns (vector-loaded), else at [row, t]; lambdas
        # and flags always at [row, t].
        zero = CAST(0)
        one = CAST(1)
        if MASKED:
            if mask[row, t] == 0:
                return False, one, zero, zero, zero
        gt = g_s
        if opts & OPT_GARR:
            gt = CAST(g[srow, st]) if gs else CAST(g[row, t])
        tm = False
        tr = False
        if KIND != SCAN:
            if opts & OPT_TERM:
                tm = term[row, t] != 0
            if opts & OPT_TRUNC:
                tr = trunc[row, t] != 0
        rt = CAST(r[srow, st])
        if KIND == SCAN:
            return True, gt, zero, rt, zero
        if KIND == RET:
            return True, (zero if tm else gt), zero, rt, zero
        lt = CAST(lm[row, t]) if opts & OPT_LARR else l_s
        vt = CAST(v[srow, st])
        a = zero if (tm or tr) else gt * lt
        if KIND == GAE_V:
            return True, a, (zero if tm else gt), rt - vt, vt
        if tm:
            c = rt - vt
        else:
            c = (rt + gt * (CAST(nv[srow, st]) if ns else CAST(nv[row, t]))) - vt
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
    def load(row, u_lo, u_hi, T, opts, r, v, nv, term, trunc, mask, g, lm, g_s, l_s,
             lv, lv_s, cu, nseg, ok, ea, eb, ec, ev, rs, rv, rq,
             stg, sb, nxt, tb1, tb2):
        """Stage the maps of steps u_lo .. u_lo+K-1 (those < u_hi) in per-thread arrays.

        K is a compile-time constant, so the loop unrolls and the arrays live in
        registers; the loads of all K steps are independent of the scan chain and
        are issued back to back.  ``rs[j]``: the state restarts (segment end)
        before step j is applied; ``rv[j]`` is the restart value.  With ``stg``
        the float inputs come from the buffers :func:`stage` filled (step j at
        slot ``spos(sb + j)``; ``nxt``: the step after the last one is staged too).
        With ``OPT_VECTOR`` the float inputs of the ``K`` steps (rewards, values,
        next values) are read ``VW`` at a time with 16-byte loads into per-thread
        arrays first (the backend checked the layout: ``T``, ``K`` and each
        thread's first step are multiples of ``VW``, so a group is wholly inside
        ``[u_lo, u_hi)`` or wholly outside); each step then reads them where it
        would read the arrays.  Flags, per-step coefficients and the value after
        the last step are read as elements.
        """
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
                    vec_put(xr, q * VW, ldg_vec(r, row, tb))
                    if GAE:
                        vec_put(xv, q * VW, ldg_vec(v, row, tb))
                    if KIND == GAE_NEXT:
                        vec_put(xn, q * VW, ldg_vec(nv, row, tb))
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
                        rv[j] = boundary(lv, lv_s, opts, s)
                        if KIND == GAE_V or KIND == GAE_NEXT:
                            rq[j] = carry_in(lv, opts, s, nseg)
                if inside:
                    t = phys(u, T)
                    if CLOAD and stg:  # CLOAD first: without it the branch is not compiled
                        # r in tb1; v (GAE) or a (scan) in tb2.
                        valid, a_, b_, c_, v_ = elem(row, t, 0, spos(sb + j), opts, tb1, tb2, nv, term,
                                                     trunc, mask, tb2, True, lm, g_s, l_s, False)
                    elif VECTOR:
                        valid, a_, b_, c_, v_ = elem(row, t, 0, j, opts, xr, xv, xn, term, trunc, mask,
                                                     g, False, lm, g_s, l_s, KIND == GAE_NEXT)
                    else:
                        valid, a_, b_, c_, v_ = elem(row, t, row, t, opts, r, v, nv, term, trunc, mask,
                                                     g, False, lm, g_s, l_s, False)
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
                        vn = boundary(lv, lv_s, opts, row)
                    elif j + 1 < K:
                        vn = ev[j + 1]
                    elif CLOAD and stg and nxt:
                        vn = tb2[0, spos(sb + K)]
                    else:
                        vn = CAST(v[row, phys(u + 1, T)])
                    ec[j] = cuda.fma(eb[j], vn, ec[j])

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
    def fold(ok, ea, eb, ec, ev, rs, rv, rq):
        """Compose the staged maps, latest step first."""
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
    def seg_at(cu, nseg, u, T):
        # OPT_SHSTEPS, packed rows: the segment holding step u and its bounds (s = -1: none).
        s = -1
        lo = 0
        hi = 0
        if PACKED:
            s = find_seg(cu, nseg, u, T)
            if s >= 0:
                lo = seg_bound(cu, s, T)
                hi = seg_bound(cu, s + 1, T)
        return s, lo, hi

    @cuda.jit(device=True)
    def seg_down(cu, nseg, u, T, s, lo, hi):
        """``(inside, restart, s, lo, hi)`` at step u, walking down from the segment
        of a later step (load's walk up, mirrored: steps are visited latest first).

        ``inside``: u is in non-empty segment s; ``restart``: u is its last step.
        Without packed rows every step is inside and none restarts.
        """
        if not PACKED:
            return True, False, s, lo, hi
        while s >= 0 and u < lo:
            s -= 1
            if s >= 0:
                lo = seg_bound(cu, s, T)
                hi = seg_bound(cu, s + 1, T)
        inside = s >= 0 and lo <= u and u < hi
        return inside, inside and u == hi - 1, s, lo, hi

    @cuda.jit(device=True)
    def restart_map(lv, lv_s, opts, s, nseg):
        # The map of segment s's end (see load's rv, rq and reset_map).
        rq = CAST(0)
        if KIND == GAE_V or KIND == GAE_NEXT:
            rq = carry_in(lv, opts, s, nseg)
        return reset_map(boundary(lv, lv_s, opts, s), rq)

    @cuda.jit(device=True)
    def shared_elem(row, t, slot, opts, v, nv, term, trunc, mask, g, lm, g_s, l_s, tb1, tb2):
        # elem of a staged step (OPT_SHSTEPS): r in tb1, v (GAE) or a (scan) in tb2.
        if KIND == SCAN:
            return elem(row, t, 0, slot, opts, tb1, tb2, nv, term, trunc, mask, tb2, True, lm, g_s, l_s,
                        False)
        return elem(row, t, 0, slot, opts, tb1, tb2, nv, term, trunc, mask, g, False, lm, g_s, l_s, False)

    @cuda.jit(device=True)
    def fold_shared(row, u_lo, u_hi, T, opts, v, nv, term, trunc, mask, g, lm, g_s, l_s,
                    lv, lv_s, cu, nseg, sb, nxt, tb1, tb2):
        """``OPT_SHSTEPS``: :func:`load` and :func:`fold` without the per-thread arrays.

        The steps' inputs were staged by :func:`stage` (step j at slot
        ``spos(sb + j)``).  Each step's map is composed as it is formed, latest
        step first.  With (alpha, c) maps its constant ``c`` (δ needs the next
        step's value, whose slot emit overwrites first) replaces the reward in
        ``tb1``, and :func:`emit` takes ``c`` from there and forms ``alpha``
        again from the flags; masked GAE's five-number maps are formed again
        whole from the staged reward and value.  Nothing of the ``K`` steps
        stays in registers across the block scan and the look-back (the
        per-thread arrays cost ~40 registers at K=8, i.e. blocks per SM).  The
        same operations as load + fold, so the same bits.
        """
        zero = CAST(0)
        ma, mb, mc, mh, mf = identity_map()
        s, seg_lo, seg_hi = seg_at(cu, nseg, u_hi - 1, T)
        for jj in range(K):
            j = K - 1 - jj
            u = u_lo + j
            if u < u_hi:
                inside, restart, s, seg_lo, seg_hi = seg_down(cu, nseg, u, T, s, seg_lo, seg_hi)
                if restart:
                    ra, rb, rc, rh, rf = restart_map(lv, lv_s, opts, s, nseg)
                    ma, mb, mc, mh, mf = compose(ra, rb, rc, rh, rf, ma, mb, mc, mh, mf)
                valid = False
                if inside:
                    valid, a_, b_, c_, v_ = shared_elem(row, phys(u, T), spos(sb + j), opts, v, nv, term,
                                                        trunc, mask, g, lm, g_s, l_s, tb1, tb2)
                if valid and USE_V:
                    ma, mb, mc, mh, mf = compose(a_, b_, c_, True, v_, ma, mb, mc, mh, mf)
                elif valid:
                    if DIRECT_V and b_ != zero:
                        # V' as in load: the boundary value, the next staged value, or one more load.
                        if PACKED and restart:
                            vn = boundary(lv, lv_s, opts, s)
                        elif u + 1 >= T:
                            vn = boundary(lv, lv_s, opts, row)
                        elif j + 1 < K:
                            vn = tb2[0, spos(sb + j + 1)]
                        elif nxt:
                            vn = tb2[0, spos(sb + K)]
                        else:
                            vn = CAST(v[row, phys(u + 1, T)])
                        c_ = cuda.fma(b_, vn, c_)
                    tb1[0, spos(sb + j)] = c_
                    ma, mb, mc, mh, mf = compose(a_, zero, c_, True, zero, ma, mb, mc, mh, mf)
        return ma, mb, mc, mh, mf

    @cuda.jit(device=True)
    def thread_map(row, live, u_lo, u_hi, T, opts, r, v, nv, term, trunc, mask, g, lm, g_s, l_s,
                   lv, lv_s, cu, nseg, ok, ea, eb, ec, ev, rs, rv, rq, stg, sb, nxt, tb1, tb2):
        # The map of this thread's steps of the tile (the identity for a row past R).
        if not live:
            return identity_map()
        if SHSTEPS:
            return fold_shared(row, u_lo, u_hi, T, opts, v, nv, term, trunc, mask, g, lm, g_s, l_s,
                               lv, lv_s, cu, nseg, sb, nxt, tb1, tb2)
        load(row, u_lo, u_hi, T, opts, r, v, nv, term, trunc, mask, g, lm, g_s, l_s,
             lv, lv_s, cu, nseg, ok, ea, eb, ec, ev, rs, rv, rq, stg, sb, nxt, tb1, tb2)
        return fold(ok, ea, eb, ec, ev, rs, rv, rq)

    @cuda.jit(device=True)
    def spos(i):
        # One padding slot per 32 elements: a thread's K consecutive slots and
        # the lanes' strided slots both fall in distinct banks.
        return i + i // 32

    @cuda.jit(device=True)
    def stage(row, live, x, y, RW, yw, wmask, ut, T, opts, r, v, g, tb1, tb2):
        """Coalesced loads of a tile's float inputs into shared memory (``OPT_CLOAD``, ``OPT_SHSTEPS``).

        The ``yw`` time-threads of row ``x`` in a warp own ``yw*K`` consecutive
        steps; they read them together, lane ``yl`` at steps ``yl, yl+yw, ...``
        of the run, into the slots :func:`emit` uses for the stores: rewards in
        ``tb1``, values (GAE) or the coefficients ``a`` (scan) in ``tb2``.  The
        flags (bytes: a warp's load instruction spans 8 sectors, not 32) and next
        values are read where they are.  Every lane of the warp must call this.
        Returns ``(stg, sb, nxt)`` for :func:`load`: whether the inputs were
        staged, the thread's first slot, and whether the step after its last
        one is staged as well (it is a later lane's).
        """
        yl = y % yw
        slot0 = ((y // yw) * RW + x) * (yw * K)
        stg = SHSTEPS or (CLOAD and yw > 1 and (opts & NOSTAGE) == 0)
        if stg:
            # No syncwarp first: a lane writes exactly the slots it read itself at the
            # end of the last tile's emit, and the slots are the warp's own.  (The
            # step/slot arithmetic is emit's, written out inline: a shared helper costs
            # the layout-"C" look-back registers, and with them a block per SM; test_ptx
            # checks the blocks per SM.)
            if live:
                ug = ut + (y // yw) * (yw * K)  # first step of the yw threads' run
                for i in range(K):
                    e = i * yw + yl
                    u = ug + e
                    if u < T:
                        t = phys(u, T)
                        sl = spos(slot0 + e)
                        tb1[0, sl] = CAST(r[row, t])
                        if GAE:
                            tb2[0, sl] = CAST(v[row, t])
                        if KIND == SCAN and opts & OPT_GARR:
                            tb2[0, sl] = CAST(g[row, t])
            cuda.syncwarp(wmask)
        return stg, slot0 + yl * K, yl + 1 < yw

    @cuda.jit(device=True)
    def emit(row, live, x, y, RW, yw, wmask, ut, u_lo, u_hi, T, ok, ea, eb, ec, ev, rs, rv, rq, A, Vn,
             out1, out2, tb1, tb2, opts, v, nv, term, trunc, mask, g, lm, g_s, l_s, lv, lv_s, cu, nseg):
        """Run the staged steps concretely from state (A, Vn) and write the outputs.

        Every lane of the warp must call this.  With ``yw > 1`` time-threads of a
        row in a warp, those ``yw`` threads own ``yw*K`` consecutive steps: the
        values pass through shared memory (``tb1``, ``tb2``) and are stored
        ``yw`` consecutive steps at a time, so the global stores are coalesced
        (one thread's ``K`` consecutive steps would hit ``K`` different sectors
        per store instruction).  With ``OPT_SHSTEPS`` the steps come from the
        staging buffers (see :func:`fold_shared`), and each slot's input is read
        before its output replaces it.
        """
        zero = CAST(0)
        two = KIND == GAE_V or KIND == GAE_NEXT
        yl = y % yw
        slot0 = ((y // yw) * RW + x) * (yw * K)  # this row's slots in the warp's part of tb
        if live:
            s = -1
            seg_lo = 0
            seg_hi = 0
            if SHSTEPS:
                s, seg_lo, seg_hi = seg_at(cu, nseg, u_hi - 1, T)
            for jj in range(K):
                j = K - 1 - jj
                u = u_lo + j
                if u < u_hi:
                    o1 = zero
                    o2 = zero
                    sl = spos(slot0 + yl * K + j)
                    if SHSTEPS:
                        inside, restart, s, seg_lo, seg_hi = seg_down(cu, nseg, u, T, s, seg_lo, seg_hi)
                        if restart:
                            ra, rb, rc, rh, rf = restart_map(lv, lv_s, opts, s, nseg)
                            A, Vn = apply(ra, rb, rc, rh, rf, A, Vn)
                        # (alpha, c): c is fold_shared's, alpha (and v) are formed again (the
                        # reward's load is dead); masked GAE: the whole map is formed again.
                        valid = False
                        if inside:
                            valid, a_, b_, c_, v_ = shared_elem(row, phys(u, T), sl, opts, v, nv, term,
                                                                trunc, mask, g, lm, g_s, l_s, tb1, tb2)
                        if valid:
                            if USE_V:
                                A, Vn = apply(a_, b_, c_, True, v_, A, Vn)
                            else:
                                A, Vn = apply(a_, zero, tb1[0, sl], False, zero, A, Vn)
                            o1 = A
                            if two:
                                o2 = A + v_
                    else:
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
            # No trailing syncwarp: tb is next written after the next block scan's barrier,
            # or (OPT_CLOAD) by stage, where each lane writes just the slots it read here.
        return A, Vn

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
    def block_suffix_scan(sh, agg, x, y, RW, TW, yw, wmask, ma, mb, mc, mh, mf):
        """Inclusive suffix scan over y of the threads' maps; leaves the results in sh.

        Thread ``(x, y)`` is lane ``(x + y*RW) % 32``: when ``RW`` divides 32, a
        warp holds ``yw`` (``warp_ys``: 32/RW, at most TW) consecutive y of every
        row x, scanned with shuffles (no barrier) over the lanes of ``wmask``;
        the warps' aggregates then meet in shared memory, each thread folding in
        those of the later warps in time order (a fixed association: results do
        not depend on timing).  Two block barriers.
        """
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

    @cuda.jit(device=True)
    def start_state(lv, lv_s, opts, row, nseg):
        zero = CAST(0)
        if PACKED:
            return zero, zero  # the segment ends restart the state
        bv = boundary(lv, lv_s, opts, row)
        if KIND == GAE_V or KIND == GAE_NEXT:
            return carry_in(lv, opts, row, nseg), bv
        return bv, zero

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
        yw = warp_ys(RW, TW)
        wmask = warp_mask(x, y, RW, TW)
        zero = CAST(0)
        tile = TW * K
        ntiles = (T + tile - 1) // tile
        ngroups = (R + RW - 1) // RW
        if not LOOKBACK:
            row = cuda.blockIdx.x * RW + x
            live = row < R
            rr = row if live else 0
            A, Vn = start_state(lv, lv_s, opts, rr, nseg)
            ti = ntiles - 1
            if PREFETCH and live:
                u0, u1 = span(ti, y, tile, T)
                load(rr, u0, u1, T, opts, r, v, nv, term, trunc, mask, g, lm, g_s, l_s,
                     lv, lv_s, cu, nseg, pok, pea, peb, pec, pev, prs, prv, prq,
                     False, 0, False, sh_tb1, sh_tb2)
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
                        # Issued now, used next iteration: the GPU waits for a load
                        # only where its value is used, so they overlap this tile.
                        n0, n1 = span(ti - 1, y, tile, T)
                        load(rr, n0, n1, T, opts, r, v, nv, term, trunc, mask, g, lm, g_s, l_s,
                             lv, lv_s, cu, nseg, pok, pea, peb, pec, pev, prs, prv, prq,
                             False, 0, False, sh_tb1, sh_tb2)
                    if live:
                        ma, mb, mc, mh, mf = fold(ok, ea, eb, ec, ev, rs, rv, rq)
                    else:
                        ma, mb, mc, mh, mf = identity_map()
                else:
                    stg, sb, nxt = stage(rr, live, x, y, RW, yw, wmask, ti * tile, T, opts, r, v, g,
                                         sh_tb1, sh_tb2)
                    ma, mb, mc, mh, mf = thread_map(rr, live, u0, u1, T, opts, r, v, nv, term, trunc, mask,
                                                    g, lm, g_s, l_s, lv, lv_s, cu, nseg, ok, ea, eb, ec, ev,
                                                    rs, rv, rq, stg, sb, nxt, sh_tb1, sh_tb2)
                block_suffix_scan(sh, sh_agg, x, y, RW, TW, yw, wmask, ma, mb, mc, mh, mf)
                if y + 1 < TW:
                    xa, xb, xc, xh, xf = read_map(sh, (y + 1) * RW + x)
                    cA, cV = apply(xa, xb, xc, xh, xf, A, Vn)
                else:
                    cA, cV = A, Vn
                ta, tb, tc, th, tf = read_map(sh, x)
                A, Vn = apply(ta, tb, tc, th, tf, A, Vn)
                emit(rr, live, x, y, RW, yw, wmask, ti * tile, u0, u1, T, ok, ea, eb, ec, ev, rs, rv, rq,
                     cA, cV, out1, out2, sh_tb1, sh_tb2,
                     opts, v, nv, term, trunc, mask, g, lm, g_s, l_s, lv, lv_s, cu, nseg)
                ti -= 1
        else:
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
            u0, u1 = span(ti, y, tile, T)
            stg, sb, nxt = stage(rr, live, x, y, RW, yw, wmask, ti * tile, T, opts, r, v, g, sh_tb1, sh_tb2)
            ma, mb, mc, mh, mf = thread_map(rr, live, u0, u1, T, opts, r, v, nv, term, trunc, mask,
                                            g, lm, g_s, l_s, lv, lv_s, cu, nseg,
                                            ok, ea, eb, ec, ev, rs, rv, rq, stg, sb, nxt, sh_tb1, sh_tb2)
            block_suffix_scan(sh, sh_agg, x, y, RW, TW, yw, wmask, ma, mb, mc, mh, mf)
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
                        A, Vn = start_state(lv, lv_s, opts, rr, nseg)
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
                        A, Vn = start_state(lv, lv_s, opts, rr, nseg)
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
            emit(rr, live, x, y, RW, yw, wmask, ti * tile, u0, u1, T, ok, ea, eb, ec, ev, rs, rv, rq,
                 A, Vn, out1, out2, sh_tb1, sh_tb2,
                 opts, v, nv, term, trunc, mask, g, lm, g_s, l_s, lv, lv_s, cu, nseg)

    if parts is not None:
        parts.update(fast_lookback=fast_lookback, lb_pack=lb_pack, lb_word=lb_word, apply=apply)
    return kernel
