"""Eight GAE rows in the lanes of one SIMD register: the LLVM code of one block of steps.

Numba's LLVM does not vectorise a chain that runs step by step across rows
(each row's recurrence is a dependent chain; the loop over rows has no
vector form it recognises), so :func:`lanes_block` writes the vectors
itself, as a Numba ``@intrinsic`` that :func:`gaescan.kernels.cpu.gae_lanes`
calls once per block of 8 rows x ``steps`` steps (a multiple of 8):

1. per row, ``steps / 8`` 32-byte loads of rewards and of values (the block's
   consecutive steps; unaligned loads), and, with terminations, as many 8-byte
   loads of the uint8 flags;
2. 8 x 8 transposes of each in registers (``shufflevector``), so that
   vector ``s`` holds step ``s`` of the 8 rows;
3. the steps of the chain, latest first, on ``<8 x float>`` (δ) and
   ``<8 x double>`` or ``<8 x float>`` (the carried advantage, per the
   build's state width): ``δ = fma(γ, V', r) − v`` in float32, then
   ``A = fma(γλ, A, δ)`` in the state width, and with terminations a select
   of ``r − v`` (no bootstrap, no carry) where the flag is set (with a mask,
   or next values and truncations, the selects of those steps, see
   :func:`lanes_block`);
4. the transposes back of both outputs (``A`` rounded to float32, and
   ``A + v``) and their 32-byte stores.

These are the operations of the default kernel's step (``_gstep``,
``_mstep``, ``_nstep`` and the plain step of ``_gae_pair`` in
:mod:`gaescan.kernels.cpu`), one for one, in
the same order and widths, so the results are bit for bit the same.  The
carry between blocks lives in four 8-element arrays the caller owns: the
state ``A``, the value after the block ``V'``, ``γ`` and ``γλ`` per row.

Every array is addressed as ``data + (i0 + q) * row_stride + t * itemsize``:
the caller checks on the host that each is contiguous along time.  Numba's
disk cache keys the kernel that calls this on :mod:`gaescan.kernels.cpu`'s
source, not on this module's: a development checkout that edits this file
clears ``NUMBA_CACHE_DIR`` (installed versions get fresh files).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32x8 = ir.VectorType(ir.IntType(32), 8)


def _shuffle(builder: Any, a: Any, b: Any, idx: list[int]) -> Any:
    return builder.shuffle_vector(a, b, ir.Constant(_I32x8, idx))


def transpose8(builder: Any, rows: list[Any]) -> list[Any]:
    """Eight 8-lane vectors (rows) -> eight 8-lane vectors (columns): an 8 x 8 transpose.

    Three rounds of two-input shuffles: pairs of rows interleaved by element,
    then by pairs of elements, then the 128-bit halves exchanged.
    """
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for k in range(0, 8, 2):
        t += [_shuffle(builder, rows[k], rows[k + 1], lo), _shuffle(builder, rows[k], rows[k + 1], hi)]
    a, b = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = []
    for base in (0, 4):
        x0, x1, y0, y1 = t[base], t[base + 1], t[base + 2], t[base + 3]
        u += [_shuffle(builder, x0, y0, a), _shuffle(builder, x0, y0, b),
              _shuffle(builder, x1, y1, a), _shuffle(builder, x1, y1, b)]
    low, high = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    cols = [None] * 8
    for c in range(4):
        cols[c] = _shuffle(builder, u[c], u[4 + c], low)
        cols[c + 4] = _shuffle(builder, u[c], u[4 + c], high)
    return cols


class _Block:
    """Addresses of one block inside an intrinsic's codegen: ``arrays`` are the
    indices of the 2-D arguments, ``i0`` and ``t0`` the block's first row and
    step.  Batch-major arrays are ``[row, step]``, contiguous along time: each
    row's steps load as one vector and 8 x 8 transposes turn rows into steps.
    Time-major arrays (``time_major``) are ``[step, row]``, contiguous along
    rows: each step of the 8 rows loads as one vector.

    With ``starts`` (the index of an 8-element int64 argument), lane ``q`` is
    not row ``i0 + q`` but the steps from ``starts[q]`` of row 0: eight places
    of one long row (packed sequences), each with a start of its own.

    With ``skew`` (the index of an int64 argument; batch-major without
    ``starts``), lane ``q`` runs ``q·skew`` steps after lane 0: rows whose
    stride is a multiple of 4 KiB would otherwise put the eight rows' lines
    of one step in one set of the level-1 data cache, which holds fewer
    ways than a block loads lines.  Lanes ``skew`` steps apart (a multiple of
    16 float32 steps, one 64-byte line) fall in different sets."""

    def __init__(self, context: Any, builder: Any, signature: Any, args: Any, arrays: range, i0: Any,
                 t0: Any, time_major: bool = False, starts: int | None = None, skew: int | None = None) -> None:
        self.time_major = time_major
        self.context, self.builder, self.args, self.st = context, builder, args, signature.args
        self.intp = context.get_value_type(types.intp)
        self.i0, self.t0 = i0, t0
        self.skew = None
        if skew is not None and not time_major and starts is None:
            self.skew = context.cast(builder, args[skew], signature.args[skew], types.intp)
        self.starts = None
        if starts is not None:
            ptr = self.vec(starts, self.intp)
            self.starts = [builder.load(builder.gep(ptr, [ir.Constant(self.intp, q)])) for q in range(8)]
        self.bases = {}
        for k in arrays:
            a = context.make_array(self.st[k])(context, builder, args[k])
            row_stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]
            self.bases[k] = builder.ptrtoint(a.data, self.intp), row_stride

    def at(self, k: int, q: int, ty: Any, itemsize: int, h: int = 0) -> Any:
        """``&array_k[i0 + q, t0 + h]`` (batch-major) or ``&array_k[t0 + h, i0 + q]``
        (time-major) as a pointer to ``ty``."""
        b, intp = self.builder, self.intp
        start, stride = self.bases[k]
        if self.starts is not None:
            off = b.mul(b.add(self.starts[q], ir.Constant(intp, h)), ir.Constant(intp, itemsize))
            return b.inttoptr(b.add(start, off), ty.as_pointer())
        major, minor = (self.t0, self.i0) if self.time_major else (self.i0, self.t0)
        if self.skew is not None and q:
            minor = b.add(minor, b.mul(self.skew, ir.Constant(intp, q)))
        off = b.add(b.mul(b.add(major, ir.Constant(intp, h if self.time_major else q)), stride),
                    b.mul(b.add(minor, ir.Constant(intp, q if self.time_major else h)), ir.Constant(intp, itemsize)))
        return b.inttoptr(b.add(start, off), ty.as_pointer())

    def prefetch(self, fetch: list[tuple[int, int]], ahead: int) -> None:
        """Ask the caches for step ``t0 + ahead`` of the 8 rows of each array in
        ``fetch``, ``(array index, item size)`` pairs.  The kernel reaches those
        vectors that many steps later, and a prefetch never faults."""
        b = self.builder
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        pf = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [i8p] + [i32] * 3),
                                            "llvm.prefetch.p0i8")
        # Arguments: read (0), highest locality (3), data cache (1).
        for k, size in fetch:
            b.call(pf, [self.at(k, 0, ir.IntType(8), size, ahead)] + [ir.Constant(i32, x) for x in (0, 3, 1)])

    def vec(self, k: int, ty: Any) -> Any:
        """The data of the 1-D argument ``k`` as a pointer to ``ty``."""
        a = self.context.make_array(self.st[k])(self.context, self.builder, self.args[k])
        return self.builder.bitcast(a.data, ty.as_pointer())

    def steps_of(self, k: int, ty: Any, itemsize: int, steps: int, conv: Any = None) -> list[Any]:
        """Vector ``s``: step ``t0 + s`` of the 8 rows of array ``k``, for ``s < steps``."""
        if self.time_major:
            vecs = [self.builder.load(self.at(k, 0, ty, itemsize, s), align=itemsize) for s in range(steps)]
            return vecs if conv is None else [conv(x) for x in vecs]
        out = []
        for h in range(0, steps, 8):
            rows = []
            for q in range(8):
                x = self.builder.load(self.at(k, q, ty, itemsize, h), align=itemsize)
                rows.append(conv(x) if conv is not None else x)
            out += transpose8(self.builder, rows)
        return out

    def store_steps(self, k: int, cols: list[Any], v8f: Any, stream: Any = None) -> None:
        """Vector ``s`` of ``cols`` to step ``t0 + s`` of the 8 float32 rows of array ``k``.

        ``stream``, an ``i1`` value or ``None`` (no), chooses at run time
        non-temporal stores of 32-byte aligned vectors (the caller guarantees
        the alignment), each row's line written whole before the next."""
        b = self.builder
        if self.time_major:
            if stream is None:
                for s, col in enumerate(cols):
                    b.store(col, self.at(k, 0, v8f, 4, s), align=4)
                return
            nt = b.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
            with b.if_else(stream) as (then, otherwise):
                with then:
                    for s, col in enumerate(cols):
                        b.store(col, self.at(k, 0, v8f, 4, s), align=32).set_metadata("nontemporal", nt)
                with otherwise:
                    for s, col in enumerate(cols):
                        b.store(col, self.at(k, 0, v8f, 4, s), align=4)
            return
        rows = [transpose8(b, cols[h:h + 8]) for h in range(0, len(cols), 8)]

        def ordinary():
            for h in range(len(rows)):
                for q, row in enumerate(rows[h]):
                    b.store(row, self.at(k, q, v8f, 4, 8 * h), align=4)

        if stream is None:
            ordinary()
            return
        nt = b.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with b.if_else(stream) as (then, otherwise):
            with then:
                for q in range(8):
                    for h in range(len(rows)):
                        st = b.store(rows[h][q], self.at(k, q, v8f, 4, 8 * h), align=32)
                        st.set_metadata("nontemporal", nt)
            with otherwise:
                ordinary()


@intrinsic
def fma(typingctx, x, y, z):
    """``x·y + z`` rounded once (``llvm.fma``), for three floats of one type.

    The scalar steps that must give the bits of the SIMD blocks (which call
    ``llvm.fma`` themselves) write their contractions with it: under
    ``fastmath={"contract"}`` LLVM decides per loop which products it fuses,
    and a loop where it fuses another one (or none) rounds differently."""
    if not (isinstance(x, types.Float) and x == y == z):
        return None
    sig = x(x, y, z)

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(signature.return_type)
        name = "llvm.fma.f32" if isinstance(ty, ir.FloatType) else "llvm.fma.f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
        return builder.call(fn, list(args))

    return sig, codegen


@intrinsic
def sfence(typingctx):
    """A store fence: the non-temporal stores before it are visible to other
    threads (x86 orders them by no other fence a kernel runs)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                            "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def data_address(typingctx, a):
    """The address of an array's first element, as an integer (``intp``)."""
    sig = types.intp(a)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, context.get_value_type(types.intp))

    return sig, codegen


@intrinsic
def stream_fill(typingctx, out, t, value, mask):
    """``out[t : t + n] = value`` by one non-temporal 32-byte store, where
    ``n = 32 // out.itemsize``; with a ``mask`` (a 1-D uint8 array, ``None``
    for none) the elements whose ``mask[t + j]`` is 0 get ``+0.0`` instead.

    ``out`` is a 1-D float array whose elements ``t .. t + n − 1`` are
    adjacent in memory and start at a 32-byte aligned address (the caller
    checks both); the store bypasses the caches, so a fill the caller does
    not read next moves each line to memory once, with no read for
    ownership.  The caller runs :func:`sfence` before its thread finishes.
    """
    sig = types.void(out, t, value, mask)
    masked = mask != types.none

    def codegen(context, builder, signature, args):
        ft = context.get_value_type(signature.args[0].dtype)
        n = 32 // context.get_abi_sizeof(ft)
        vt = ir.VectorType(ft, n)
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [idx]), vt.as_pointer())
        x = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        vec = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
        vec = builder.shuffle_vector(vec, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))
        if masked:
            m = context.make_array(signature.args[3])(context, builder, args[3])
            mt = ir.VectorType(ir.IntType(8), n)
            keep = builder.load(builder.bitcast(builder.gep(m.data, [idx]), mt.as_pointer()), align=1)
            keep = builder.icmp_unsigned("!=", keep, ir.Constant(mt, [0] * n))
            vec = builder.select(keep, vec, ir.Constant(vt, [0.0] * n))
        st = builder.store(vec, ptr, align=32)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


def lanes_block(has_term: bool, wide: bool, steps: int = 8, has_next: bool = False,
                has_mask: bool = False, packed: bool = False, time_major: bool = False,
                prefetch: int = 0) -> Any:
    """The intrinsic ``block(r, v, term, adv, ret, i0, t0, sa, sv, g8, gl8, nv, flags2, stream, skew)``.

    It runs steps ``t0 + steps - 1`` down to ``t0`` (``steps`` a multiple of 8:
    each row's loads and stores are ``steps / 8`` vectors, transposed 8 x 8 at
    a time) of rows ``i0 .. i0 + 7`` of the
    float32 arrays ``r``, ``v`` (read), ``adv``, ``ret`` (written) and, with
    ``has_term``, the uint8 flags ``term``; ``sa`` (the carried advantage,
    float64 when ``wide``, else float32), ``sv`` (the value after the block),
    ``g8`` (γ) and ``gl8`` (γλ, the state's width) hold one element per row
    and are updated in place.

    With ``has_next`` (which needs ``has_term``) it also reads the float32
    ``nv`` (``V'`` of each step) and the uint8 truncation flags ``flags2``,
    and runs the step of ``_nstep`` in :mod:`gaescan.kernels.cpu`: the
    bootstrap is cut where ``term`` is set, the carry where ``term`` or the
    truncation is; ``sv`` is then not used.

    With ``has_mask`` it reads the uint8 mask ``flags2`` and runs the step of
    ``_mstep``: at a masked step the carried advantage and value pass through
    and both outputs are 0, all by selects.

    ``nv`` and ``flags2`` are not read where no option needs them (any arrays
    of those types).

    With ``packed``, ``i0`` is an int64 array of 8 starts and ``t0`` is not
    read: lane ``q`` runs steps ``i0[q] + steps - 1`` down to ``i0[q]`` of row 0
    (eight places of one row of packed sequences, see :class:`_Block`).

    With ``stream`` (a run-time boolean), the outputs are written by
    non-temporal stores, each row's 64 bytes whole before the next: no read
    of the lines for ownership, and the outputs do not evict the inputs from
    the caches.  Every 8-step vector of ``adv`` and ``ret`` must then be
    32-byte aligned (a misaligned one faults), and the kernel runs
    :func:`sfence` before it returns.

    ``skew`` (an int64, read by batch-major blocks without ``packed``) shifts
    lane ``q`` to steps ``t0 + q·skew ..`` (see :class:`_Block`); with
    ``stream`` it is a multiple of 16.

    With ``time_major`` the arrays are ``[step, column]`` (see
    :class:`_Block`): ``i0`` is the first of 8 consecutive columns and each
    step one vector per array, so ``steps`` may be any count.  ``prefetch``
    (time-major, without a mask) asks for the inputs of step
    ``t0 − prefetch`` into the caches: a time-major sweep jumps back a whole
    row at each step, a pattern the hardware prefetchers learn only after
    some lines of each stretch.
    """
    if has_next and not has_term:
        raise ValueError("the next_values block reads both flags: has_next needs has_term")
    if prefetch and not (time_major and not has_mask):
        raise ValueError("only the time-major blocks without a mask prefetch")
    if has_next and has_mask:
        raise ValueError("no lanes block takes next values and a mask together")

    @intrinsic
    def block(typingctx, r, v, term, adv, ret, i0, t0, sa, sv, g8, gl8, nv, flags2, stream, skew):
        sig = types.void(r, v, term, adv, ret, i0, t0, sa, sv, g8, gl8, nv, flags2, stream, skew)

        def codegen(context, builder, signature, args):
            arrays = (0, 1, 2, 3, 4, 11, 12) if has_next else (0, 1, 2, 3, 4, 12) if has_mask else range(5)
            blk = _Block(context, builder, signature, args, arrays, args[5], args[6], time_major=time_major,
                         starts=5 if packed else None, skew=14)
            f32 = ir.FloatType()
            v8f = ir.VectorType(f32, 8)
            v8s = ir.VectorType(ir.DoubleType() if wide else f32, 8)
            fma_f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3),
                                                   "llvm.fma.v8f32")
            fma_s = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8s, [v8s] * 3),
                                                   "llvm.fma.v8f64" if wide else "llvm.fma.v8f32")

            if prefetch:
                # A reverse sweep: step t0 − prefetch comes that many steps later.
                blk.prefetch([(0, 4), (1, 4)] + ([(2, 1)] if has_term else [])
                             + ([(11, 4), (12, 1)] if has_next else []), -prefetch)
            R = blk.steps_of(0, v8f, 4, steps)
            V = blk.steps_of(1, v8f, 4, steps)
            v8b = ir.VectorType(ir.IntType(8), 8)
            if has_term:
                D = blk.steps_of(2, v8b, 1, steps, lambda x: builder.zext(x, _I32x8))
            if has_next:
                NV = blk.steps_of(11, v8f, 4, steps)
                TR = blk.steps_of(12, v8b, 1, steps, lambda x: builder.zext(x, _I32x8))
            if has_mask:
                M = blk.steps_of(12, v8b, 1, steps, lambda x: builder.zext(x, _I32x8))
                zf = ir.Constant(v8f, [0.0] * 8)
            pa, pv = blk.vec(7, v8s), blk.vec(8, v8f)
            A = builder.load(pa, align=8 if wide else 4)
            vn = builder.load(pv, align=4)
            g = builder.load(blk.vec(9, v8f), align=4)
            gl = builder.load(blk.vec(10, v8s), align=8 if wide else 4)
            zero = ir.Constant(_I32x8, [0] * 8)

            def widen(x):
                return builder.fpext(x, v8s) if wide else x

            out_a, out_r = [None] * steps, [None] * steps
            for s in range(steps - 1, -1, -1):
                rt, vt = R[s], V[s]
                if has_next:
                    # δ = r − v at a termination (no bootstrap), else fma(γ, V', r) − v;
                    # the carry stops at a termination or a truncation.  Selects, as
                    # in _nstep: a NaN past an episode's end never reaches it.
                    tm = builder.icmp_unsigned("!=", D[s], zero)
                    done = builder.or_(tm, builder.icmp_unsigned("!=", TR[s], zero))
                    delta = widen(builder.select(tm, builder.fsub(rt, vt),
                                                 builder.fsub(builder.call(fma_f, [g, NV[s], rt]), vt)))
                    A = builder.select(done, delta, builder.call(fma_s, [gl, A, delta]))
                    o = builder.fptrunc(A, v8f) if wide else A
                    out_a[s] = o
                    out_r[s] = builder.fadd(o, vt)
                    continue
                x = builder.call(fma_s, [gl, A, widen(builder.fsub(builder.call(fma_f, [g, vn, rt]), vt))])
                if has_mask:
                    # The step of _mstep: computed everywhere, chosen only where valid.
                    ok = builder.icmp_unsigned("!=", M[s], zero)
                    if has_term:
                        x = builder.select(builder.icmp_unsigned("!=", D[s], zero), widen(builder.fsub(rt, vt)), x)
                    A = builder.select(ok, x, A)
                    vn = builder.select(ok, vt, vn)
                    o = builder.select(ok, builder.fptrunc(x, v8f) if wide else x, zf)
                    out_a[s] = o
                    out_r[s] = builder.fadd(o, builder.select(ok, vt, zf))
                    continue
                if has_term:
                    # A select, not a multiplication by (1 - done): a NaN after the
                    # episode's end never reaches it.
                    A = builder.select(builder.icmp_unsigned("!=", D[s], zero), widen(builder.fsub(rt, vt)), x)
                else:
                    A = x
                o = builder.fptrunc(A, v8f) if wide else A
                out_a[s] = o
                out_r[s] = builder.fadd(o, vt)
                vn = vt
            builder.store(A, pa, align=8 if wide else 4)
            if not has_next:
                builder.store(vn, pv, align=4)
            blk.store_steps(3, out_a, v8f, args[13])
            blk.store_steps(4, out_r, v8f, args[13])
            return context.get_dummy_value()

        return sig, codegen

    return block


def scan_block(kind: str, reverse: bool, has_term: bool = False, prefetch: int = 0, time_major: bool = True,
               steps: int = 1) -> Any:
    """The intrinsic ``block(x, b, flags, out, i0, t0, state, g8, stream, skew)``:
    ``steps`` steps of eight sequences of float32 arrays, with the steps of
    the CPU kernels one for one.

    Time-major (``time_major``, the default): step ``t0`` of columns
    ``i0 .. i0 + 7`` of ``(T, R)`` arrays contiguous along the columns, the
    steps of the general kernels (:func:`gaescan.kernels.cpu.scan_tm`,
    :func:`gaescan.kernels.cpu.returns_tm`), products and sums rounded
    separately as there (no FMA); ``steps`` is 1.  Batch-major: steps ``t0 ..
    t0 + steps − 1`` (``steps`` a multiple of 8, loaded and stored as in
    :func:`lanes_block`) of rows ``i0 .. i0 + 7`` of ``(R, T)`` arrays
    contiguous along time, the steps of the pair kernels
    (:func:`gaescan.kernels.cpu.scan_rows`: no FMA;
    :func:`gaescan.kernels.cpu.returns_rows_fused`: ``x + γ·G`` as one FMA,
    as LLVM contracts it there), from the block's last step down with
    ``reverse``, else from its first up; batch-major lane ``q`` runs
    ``q·skew`` steps after lane 0 (``skew`` as in :func:`lanes_block`).

    * ``kind="scan"``: ``y = b`` where ``x == 0`` (``x`` the coefficient ``a``),
      else ``x·y + b`` (a select: a NaN or infinity carried in ``y`` stops
      there); ``flags`` and ``g8`` are not read.
    * ``kind="returns"`` (``reverse`` only): ``G = x`` (the reward) where
      ``flags`` is set (with ``has_term``), else ``x + γ·G``, ``γ`` from
      ``g8`` (float32, one per sequence, from item 0); ``b`` is not read.

    ``state`` (8 items, its dtype the state's width) holds the carry and is
    updated in place.  ``out`` is written by non-temporal stores where
    ``stream`` (aligned vectors: see :func:`lanes_block`), else by ordinary
    ones.  ``prefetch`` (time-major) asks for the inputs of the step that
    many steps later in the scan's order (``t0 − prefetch`` with ``reverse``).
    """
    if kind not in ("scan", "returns"):
        raise ValueError(f"kind must be 'scan' or 'returns', not {kind!r}")
    if kind == "returns" and not reverse:
        raise ValueError("discounted returns run in reverse only")
    if time_major != (steps == 1) or steps % 8 and not time_major:
        raise ValueError("a time-major block runs one step, a batch-major one a multiple of 8")
    if prefetch and not time_major:
        raise ValueError("only the time-major blocks prefetch")

    @intrinsic
    def block(typingctx, x, b, flags, out, i0, t0, state, g8, stream, skew):
        sig = types.void(x, b, flags, out, i0, t0, state, g8, stream, skew)

        def codegen(context, builder, signature, args):
            scan = kind == "scan"
            arrays = (0, 1, 3) if scan else ((0, 2, 3) if has_term else (0, 3))
            blk = _Block(context, builder, signature, args, arrays, args[4], args[5], time_major=time_major,
                         skew=9)
            f32 = ir.FloatType()
            v8f = ir.VectorType(f32, 8)
            wide = signature.args[6].dtype == types.float64
            v8s = ir.VectorType(ir.DoubleType() if wide else f32, 8)
            ssz = 8 if wide else 4
            if prefetch:
                blk.prefetch([(0, 4), (1, 4)] if scan else [(0, 4)] + ([(2, 1)] if has_term else []),
                             -prefetch if reverse else prefetch)

            def widen(v):
                return builder.fpext(v, v8s) if wide else v

            ps = blk.vec(6, v8s)
            y = builder.load(ps, align=ssz)
            X = blk.steps_of(0, v8f, 4, steps)
            if scan:
                B = blk.steps_of(1, v8f, 4, steps)
                zf = ir.Constant(v8f, [0.0] * 8)
            else:
                g = widen(builder.load(blk.vec(7, v8f), align=4))
                fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8s, [v8s] * 3),
                                                     "llvm.fma.v8f64" if wide else "llvm.fma.v8f32")
                if has_term:
                    v8b = ir.VectorType(ir.IntType(8), 8)
                    D = blk.steps_of(2, v8b, 1, steps, lambda v: builder.zext(v, _I32x8))
            outs = [None] * steps
            for s in (range(steps - 1, -1, -1) if reverse else range(steps)):
                if scan:
                    bs = widen(B[s])
                    y = builder.select(builder.fcmp_ordered("==", X[s], zf), bs,
                                       builder.fadd(builder.fmul(widen(X[s]), y), bs))
                else:
                    xs = widen(X[s])
                    nxt = builder.fadd(xs, builder.fmul(g, y)) if time_major else builder.call(fma, [g, y, xs])
                    if has_term:
                        done = builder.icmp_unsigned("!=", D[s], ir.Constant(_I32x8, [0] * 8))
                        nxt = builder.select(done, xs, nxt)
                    y = nxt
                outs[s] = builder.fptrunc(y, v8f) if wide else y
            builder.store(y, ps, align=ssz)
            blk.store_steps(3, outs, v8f, args[8])
            return context.get_dummy_value()

        return sig, codegen

    return block


# exp on <8 x double>: the operations of gaescan.kernels.cpu_vtrace._exp (its
# constants and steps, in the same order), lane by lane: the same bits.
def _exp8(builder: Any, x: Any, fma: Any) -> Any:
    from .cpu_vtrace import _EXP_MAX, _LN2_HI, _LN2_LO, _LOG2E, _SHIFT

    f64 = ir.DoubleType()
    v8d = ir.VectorType(f64, 8)
    v8i = ir.VectorType(ir.IntType(64), 8)

    def c(val):
        return ir.Constant(v8d, [val] * 8)

    def ci(val):
        return ir.Constant(v8i, [val] * 8)

    lo = c(-745.5)
    hi = c(709.9)
    xc = builder.select(builder.fcmp_ordered(">", x, lo), x, lo)
    xc = builder.select(builder.fcmp_ordered("<", xc, hi), xc, hi)
    t = builder.call(fma, [xc, c(_LOG2E), c(_SHIFT)])
    k = builder.fsub(t, c(_SHIFT))
    r = builder.fsub(builder.fsub(xc, builder.fmul(k, c(_LN2_HI))), builder.fmul(k, c(_LN2_LO)))
    r2 = builder.fmul(r, r)
    r4 = builder.fmul(r2, r2)

    def lin(a, b):  # a + r * b
        return builder.call(fma, [r, c(b), c(a)])

    s0 = builder.call(fma, [lin(0.5, 1.0 / 6.0), r2, builder.fadd(c(1.0), r)])
    s1 = builder.call(fma, [lin(1.0 / 720.0, 1.0 / 5040.0), r2, lin(1.0 / 24.0, 1.0 / 120.0)])
    s2 = builder.call(fma, [lin(1.0 / 3628800.0, 1.0 / 39916800.0), r2, lin(1.0 / 40320.0, 1.0 / 362880.0)])
    p = builder.call(fma, [c(1.0 / 479001600.0), r4, s2])
    p = builder.call(fma, [p, r4, s1])
    p = builder.call(fma, [p, r4, s0])
    ki = builder.sub(builder.bitcast(t, v8i), builder.bitcast(c(_SHIFT), v8i))
    # ki >> 1 (arithmetic) as a logical shift of ki + 2048 (|ki| < 2048): AVX2 has no
    # arithmetic shift of 64-bit lanes.
    h = builder.sub(builder.lshr(builder.add(ki, ci(2048)), ci(1)), ci(1024))
    p1 = builder.bitcast(builder.shl(builder.add(h, ci(1023)), ci(52)), v8d)
    p2 = builder.bitcast(builder.shl(builder.add(builder.sub(ki, h), ci(1023)), ci(52)), v8d)
    y = builder.fmul(builder.fmul(p, p1), p2)
    y = builder.select(builder.fcmp_ordered(">", x, c(_EXP_MAX)), c(float("inf")), y)
    return builder.select(builder.fcmp_unordered("uno", x, x), x, y)


_EXPM_LO, _EXPM_HI = -87.0, 88.0
_EXPM_SHIFT = 12582912.0  # 1.5·2^23: x + _EXPM_SHIFT rounds x to an integer in the low bits
# P(r) = (e^r − 1 − r) / r², a least-squares fit on 2000 Chebyshev nodes of |r| ≤ 0.3466,
# coefficients rounded to float32, highest degree first.
_EXPM_POLY = (1.989929296541959e-4, 1.3933657901361585e-3, 8.3332983776927e-3, 4.1666463017463684e-2,
              1.666666716337204e-1, 0.5)


# e^x on <8 x float> in [_EXPM_LO, _EXPM_HI], within one float32 ulp: x = k·ln 2 + r
# with ln 2 split in two (_LN2_HI32 has 16 significant bits, so k·_LN2_HI32 is exact for
# |k| < 256), e^r = 1 + (r + r²·P(r)), times 2^k built from exponent bits (k in
# [−126, 127] on that range).
_LN2_HI32 = 0.693145751953125
_LN2_LO32 = 1.4286068203094173e-06


def _exp8_f32(builder: Any, x: Any, fma32: Any) -> Any:
    from .cpu_vtrace import _LOG2E

    v8f = ir.VectorType(ir.FloatType(), 8)

    def c(val):
        return ir.Constant(v8f, [val] * 8)

    t = builder.call(fma32, [x, c(_LOG2E), c(_EXPM_SHIFT)])
    nk = builder.fsub(c(_EXPM_SHIFT), t)  # −k, exact
    r = builder.call(fma32, [nk, c(_LN2_HI32), x])
    r = builder.call(fma32, [nk, c(_LN2_LO32), r])
    p = c(_EXPM_POLY[0])
    for coef in _EXPM_POLY[1:]:
        p = builder.call(fma32, [p, r, c(coef)])
    y = builder.fadd(c(1.0), builder.call(fma32, [builder.fmul(r, r), p, r]))
    ki = builder.sub(builder.bitcast(t, _I32x8), builder.bitcast(c(_EXPM_SHIFT), _I32x8))
    scale = builder.bitcast(builder.shl(builder.add(ki, ir.Constant(_I32x8, [127] * 8)),
                                        ir.Constant(_I32x8, [23] * 8)), v8f)
    y = builder.fmul(y, scale)
    return builder.select(builder.fcmp_unordered("uno", x, x), x, y)


def _any_outside(builder: Any, LR: list[Any]) -> Any:
    """An ``i1``: whether a lane of the ``<8 x float>`` vectors ``LR`` lies
    outside ``[_EXPM_LO, _EXPM_HI]`` (±inf included; NaN is not: it passes
    through either form of the V-trace block).  Such a log-ratio sends a whole
    block to the float64 form."""
    v8f = ir.VectorType(ir.FloatType(), 8)
    lo, hi = ir.Constant(v8f, [_EXPM_LO] * 8), ir.Constant(v8f, [_EXPM_HI] * 8)
    outside = None
    for lr in LR:
        o = builder.or_(builder.fcmp_ordered("<", lr, lo), builder.fcmp_ordered(">", lr, hi))
        outside = o if outside is None else builder.or_(outside, o)
    return builder.icmp_unsigned("!=", builder.bitcast(outside, ir.IntType(8)), ir.Constant(ir.IntType(8), 0))


def log_ratios_outside(steps: int = 16) -> Any:
    """The intrinsic ``outside(lr, c0, t0) -> bool``: whether a log-ratio of
    steps ``t0 .. t0 + steps - 1`` of columns ``c0 .. c0 + 7`` of the
    time-major float32 ``lr`` (``[step, column]``, contiguous along columns)
    lies outside ``[_EXPM_LO, _EXPM_HI]``: the check a ``steps``-step
    :func:`vtrace_lanes_block` makes, for blocks built ``checked``."""
    @intrinsic
    def outside(typingctx, lr, c0, t0):
        sig = types.boolean(lr, c0, t0)

        def codegen(context, builder, signature, args):
            blk = _Block(context, builder, signature, args, (0,), args[1], args[2], time_major=True)
            return _any_outside(builder, blk.steps_of(0, ir.VectorType(ir.FloatType(), 8), 4, steps))

        return sig, codegen

    return outside


def vtrace_lanes_block(has_term: bool, steps: int = 16, time_major: bool = False, has_next: bool = False,
                       state32: bool = False, checked: bool = False) -> Any:
    """The intrinsic ``block(r, v, lr, term, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, nv, trunc, nt, wide, skew)``.

    V-trace on steps ``t0 + steps - 1`` down to ``t0`` (``steps`` a multiple
    of 8) of rows ``i0 .. i0 + 7`` (``[row, step]`` arrays, or ``[step, row]``
    with ``time_major``) of the float32 arrays ``r``, ``v``, ``lr``
    (rewards, values, log-ratios; read), ``vs``, ``adv`` (written) and, with
    ``has_term``, the uint8 flags ``term``; with ``has_next``, the float32
    ``nv`` (``next_values``, the bootstrap ``V'`` of each step) and the uint8
    flags ``term`` and ``trunc`` (a done is either; ``nv`` and ``trunc`` are
    not read without ``has_next``).  ``sx`` (the trace ``D`` after
    the block), ``sv`` (the value after the block), ``g8`` (γ) and ``gl8``
    (γλ) are float64 arrays of one element per row, the first two updated in
    place; ``rb``, ``cb``, ``pb`` are the clipping thresholds (float64).
    ``nt`` (a boolean, read at run time) writes ``vs`` and ``adv`` by
    non-temporal stores: batch-major blocks only, and the caller guarantees
    that step ``t0`` of every row of both starts a 32-byte aligned vector.
    ``wide`` (a boolean) is read with ``checked`` only: see below.  ``skew``
    (an int64, read by batch-major blocks) shifts lane ``q`` to steps
    ``t0 + q·skew ..``, as in :func:`lanes_block`.

    Per step, the terms of the V-trace fast path
    (:mod:`gaescan.kernels.cpu_vtrace`): ``e = exp(lr)``, the bracket
    ``w = r + γV' − v`` (``r − v`` at a done), ``δ = min(ρ̄, e)·w``, the
    carry ``D = δ + γλ·min(c̄, e)·D'`` (``D = δ`` at a done: a select, so a
    NaN beyond the episode's end never reaches it; so at a zero decay, which
    only the float64 form below meets: the callers give these blocks no zero
    γλ, and ``e`` is positive in the float32 range), ``vs = v + D`` and the
    advantage ``min(ρ̄pg, e)·(w + γ·D')`` (``D'`` taken as 0 at a done).

    ``e``, ``w`` and the advantage are computed on ``<8 x float>``
    (:func:`_exp8_f32`, within one float32 ulp), ``δ``, the decay
    ``γλ·min(c̄, e)``, the carry ``D`` and ``vs`` on ``<8 x double>``: γλ and
    the carry in float32 would drift over long horizons (SPEC, Accuracy), and
    ``δ`` in float64 keeps a large product of ``e`` and ``w`` from
    overflowing before the decay shrinks it.  Float64 operations take four
    128-bit operations each on CPUs that split 256-bit ones, so the rest stays
    in float32.  A block with a log-ratio outside ``[_EXPM_LO, _EXPM_HI]``
    runs every term on ``<8 x double>`` with :func:`_exp8`, the scalar
    kernels' float64 exponential, and gives their bits.  With ``checked``
    the caller has made that check (over a span of steps that holds the
    block's) and passes its answer as ``wide``: blocks shorter than 16 steps
    then take the same form, so the same bits, as a 16-step block over the
    span.

    With ``state32`` the other blocks carry ``D`` in float32 too: ``δ``, the
    decay, ``D`` and ``vs`` on ``<8 x float>``, half the operations and
    registers of the float64 carry.  The caller chooses it where the decay
    and the weight ``min(ρ̄, e)`` are bounded as for GAE's float32 state;
    ``sx`` stays float64 (a float32 value, exactly) between blocks.
    """
    @intrinsic
    def block(typingctx, r, v, lr, term, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, nv, trunc, nt, wide, skew):
        sig = types.void(r, v, lr, term, vs, adv, i0, t0, sx, sv, g8, gl8, rb, cb, pb, nv, trunc, nt, wide, skew)

        def codegen(context, builder, signature, args):
            arrays = (0, 1, 2, 3, 4, 5, 15, 16) if has_next else range(6)
            blk = _Block(context, builder, signature, args, arrays, args[6], args[7], time_major, skew=19)
            f32 = ir.FloatType()
            f64 = ir.DoubleType()
            v8f = ir.VectorType(f32, 8)
            v8d = ir.VectorType(f64, 8)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8d, [v8d] * 3),
                                                 "llvm.fma.v8f64")

            def wide(x):
                return builder.fpext(x, v8d)

            R = blk.steps_of(0, v8f, 4, steps)
            V = blk.steps_of(1, v8f, 4, steps)
            LR = blk.steps_of(2, v8f, 4, steps)
            flags = ir.VectorType(ir.IntType(8), 8)
            if has_term or has_next:
                D = blk.steps_of(3, flags, 1, steps, lambda x: builder.zext(x, _I32x8))
            if has_next:
                NV = blk.steps_of(15, v8f, 4, steps)
                TR = blk.steps_of(16, flags, 1, steps, lambda x: builder.zext(x, _I32x8))
            px, pv = blk.vec(8, v8d), blk.vec(9, v8d)
            x = builder.load(px, align=8)
            vn = builder.load(pv, align=8)
            g = builder.load(blk.vec(10, v8d), align=8)
            gl = builder.load(blk.vec(11, v8d), align=8)

            def splat(val):
                return builder.insert_element(ir.Constant(v8d, ir.Undefined), val, ir.Constant(ir.IntType(32), 0))

            zi = ir.Constant(_I32x8, [0] * 8)
            bars = [builder.shuffle_vector(splat(b), ir.Constant(v8d, ir.Undefined), zi) for b in args[12:15]]
            rb, cb, pb = bars
            zero = ir.Constant(v8d, [0.0] * 8)

            def clip(bar, e):
                # min(bar, e) keeping a NaN e.
                return builder.select(builder.fcmp_ordered("<", bar, e), bar, e)

            def cut(s, rt, vt, w, c, zc, x, zx):
                """Step ``s``'s bracket ``w``, decay ``c`` and carried trace ``x`` after its
                flags: a termination takes no bootstrap (``w = r − v``), a done (a
                termination, or with next values a truncation) no carry (``c`` is
                ``zc``, the trace ``zx``, zeros of their types).  Selects: a NaN past
                the episode's end stays out."""
                if not (has_term or has_next):
                    return w, c, x
                tm = builder.icmp_unsigned("!=", D[s], zi)
                dn = builder.or_(tm, builder.icmp_unsigned("!=", TR[s], zi)) if has_next else tm
                return (builder.select(tm, builder.fsub(rt, vt), w), builder.select(dn, zc, c),
                        builder.select(dn, zx, x))

            stream = None if time_major else context.cast(builder, args[17], signature.args[17], types.boolean)

            def finish(x, vn, out_s, out_a):
                builder.store(x, px, align=8)
                builder.store(vn, pv, align=8)
                blk.store_steps(4, out_s, v8f, stream)
                blk.store_steps(5, out_a, v8f, stream)

            def run64(x, vn):
                out_s, out_a = [None] * steps, [None] * steps
                for s in range(steps - 1, -1, -1):
                    rt, vt, e = wide(R[s]), wide(V[s]), _exp8(builder, wide(LR[s]), fma)
                    w = builder.fsub(builder.call(fma, [g, wide(NV[s]) if has_next else vn, rt]), vt)
                    w, cw, xm = cut(s, rt, vt, w, builder.fmul(gl, clip(cb, e)), zero, x, zero)
                    a = builder.fmul(clip(pb, e), builder.call(fma, [g, xm, w]))
                    # A zero decay (a done's, γλ = 0, or e underflowing, which only
                    # this float64 form meets) drops the carry, as a done does.
                    xc = builder.select(builder.fcmp_ordered("==", cw, zero), zero, xm)
                    x = builder.call(fma, [cw, xc, builder.fmul(clip(rb, e), w)])
                    out_s[s] = builder.fptrunc(builder.fadd(vt, x), v8f)
                    out_a[s] = builder.fptrunc(a, v8f)
                    vn = vt
                finish(x, vn, out_s, out_a)

            fma32 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3),
                                                   "llvm.fma.v8f32")

            def run32(x, vn):
                def narrow(v):
                    return builder.fptrunc(v, v8f)

                g32, zero32 = narrow(g), ir.Constant(v8f, [0.0] * 8)
                rb32, cb32, pb32 = (narrow(b) for b in bars)
                vn32 = narrow(vn)
                if state32:
                    x, gl32 = narrow(x), narrow(gl)
                out_s, out_a = [None] * steps, [None] * steps
                for s in range(steps - 1, -1, -1):
                    rt, vt = R[s], V[s]
                    e = _exp8_f32(builder, LR[s], fma32)
                    w = builder.fsub(builder.call(fma32, [g32, NV[s] if has_next else vn32, rt]), vt)
                    if state32:
                        w, ce, xm = cut(s, rt, vt, w, clip(cb32, e), zero32, x, zero32)
                        x = builder.call(fma32, [builder.fmul(gl32, ce), xm, builder.fmul(clip(rb32, e), w)])
                        out_a[s] = builder.fmul(clip(pb32, e), builder.call(fma32, [g32, xm, w]))
                        out_s[s] = builder.fadd(vt, x)
                    else:
                        w, ce, xm = cut(s, rt, vt, w, clip(cb32, e), zero32, x, zero)
                        delta = builder.fmul(wide(clip(rb32, e)), wide(w))
                        x = builder.call(fma, [builder.fmul(gl, wide(ce)), xm, delta])
                        out_a[s] = builder.fmul(clip(pb32, e), builder.call(fma32, [g32, narrow(xm), w]))
                        out_s[s] = narrow(builder.fadd(wide(vt), x))
                    vn32 = vt
                finish(wide(x) if state32 else x, wide(vn32), out_s, out_a)

            if checked:
                wide_range = context.cast(builder, args[18], signature.args[18], types.boolean)
            else:
                wide_range = _any_outside(builder, LR)

            with builder.if_else(wide_range, likely=False) as (then, otherwise):
                with then:
                    run64(x, vn)
                with otherwise:
                    run32(x, vn)
            return context.get_dummy_value()

        return sig, codegen

    return block
