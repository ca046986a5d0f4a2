"""Candidate for issue 17: batch-major GAE with eight rows in SIMD lanes.

Run: ``python benchmarks/vector_lanes_probe.py [--repeat N]``.

Numba's LLVM does not vectorise a step-major chain across rows
(``row_chain_probe.py``), so this probe builds the vectors itself: a Numba
``@intrinsic`` loads an 8-row by 8-step block of rewards, values and uint8
dones with 32-byte loads (8-byte for the flags), transposes each 8x8 block in
registers (``shufflevector``), runs the eight steps of the GAE chain on
``<8 x float>`` (or ``<8 x double>`` for the float64 state) vectors with
explicit FMAs and a select for dones, transposes the two outputs back and
stores them row by row.  The arithmetic is the default kernel's, operation for
operation (``fma(γ, V', r) - v`` in the data dtype, then ``fma(γλ, A, δ)`` in
the state dtype), so the outputs are bit-identical to ``gaescan.gae``; the
script checks that before it times anything.

It covers float32 C-contiguous ``[R, T]`` with ``R % 8 == 0``, plain and
dones, both state widths; not masks, ``next_values``, packing or float64.
It prints medians of the default (``gaescan.gae`` into preallocated outputs)
and of the candidate on ``[256, 131072]``, each against a STREAM triad in
the same round.
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

_FM = {"contract"}


def _transpose8(builder, rows):
    """Eight <8 x T> rows -> eight <8 x T> columns (an 8x8 transpose)."""
    def sh(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), idx))
    lo = [0, 8, 1, 9, 4, 12, 5, 13]
    hi = [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for k in range(0, 8, 2):
        t += [sh(rows[k], rows[k + 1], lo), sh(rows[k], rows[k + 1], hi)]
    # t0 = (r0_0 r1_0 r0_1 r1_1 | r0_4 r1_4 r0_5 r1_5), t1 = (r0_2 r1_2 r0_3 r1_3 | ...6 7)
    a = [0, 1, 8, 9, 4, 5, 12, 13]
    b = [2, 3, 10, 11, 6, 7, 14, 15]
    u = []
    for base in (0, 4):
        x0, x1, y0, y1 = t[base], t[base + 1], t[base + 2], t[base + 3]
        u += [sh(x0, y0, a), sh(x0, y0, b), sh(x1, y1, a), sh(x1, y1, b)]
    # u[0..3]: columns 0,1,2,3 of rows 0-3 in the low half, columns 4,5,6,7 in the high half
    low = [0, 1, 2, 3, 8, 9, 10, 11]
    high = [4, 5, 6, 7, 12, 13, 14, 15]
    cols = [None] * 8
    for c in range(4):
        cols[c] = sh(u[c], u[4 + c], low)
        cols[c + 4] = sh(u[c], u[4 + c], high)
    return cols


def _make_block(has_term, wide):
    @intrinsic
    def block(typingctx, r, v, d, adv, ret, i0, t0, sa, sv, g8, gl8):
        sig = types.void(r, v, d, adv, ret, i0, t0, sa, sv, g8, gl8)

        def codegen(context, builder, signature, args):
            ar, av, ad, aadv, aret, ai0, at0, asa, asv, ag8, agl8 = args
            st = signature.args
            intp = context.get_value_type(types.intp)
            f32, f64 = ir.FloatType(), ir.DoubleType()
            v8f = ir.VectorType(f32, 8)
            v8d = ir.VectorType(f64 if wide else f32, 8)
            v8b = ir.VectorType(ir.IntType(8), 8)
            v8i = ir.VectorType(ir.IntType(32), 8)
            fma32 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")
            fma64 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8d, [v8d] * 3), "llvm.fma.v8f64" if wide else "llvm.fma.v8f32")

            def arr(k):
                a = context.make_array(st[k])(context, builder, args[k])
                s0 = cgutils.unpack_tuple(builder, a.strides, st[k].ndim)[0]
                return builder.ptrtoint(a.data, intp), s0

            def rowptr(k, row, ty, item):
                base, s0 = arrs[k]
                off = builder.add(builder.mul(builder.add(ai0, ir.Constant(intp, row)), s0),
                                  builder.mul(at0, ir.Constant(intp, item)))
                return builder.inttoptr(builder.add(base, off), ty.as_pointer())

            arrs = {k: arr(k) for k in (0, 1, 2, 3, 4)}
            R = _transpose8(builder, [builder.load(rowptr(0, q, v8f, 4), align=4) for q in range(8)])
            V = _transpose8(builder, [builder.load(rowptr(1, q, v8f, 4), align=4) for q in range(8)])
            if has_term:
                D = _transpose8(builder, [builder.zext(builder.load(rowptr(2, q, v8b, 1), align=1), v8i)
                                          for q in range(8)])
            def vec1(k, ty):
                a = context.make_array(st[k])(context, builder, args[k])
                return builder.bitcast(a.data, ty.as_pointer())
            pa, pv = vec1(7, v8d), vec1(8, v8f)
            A = builder.load(pa, align=8)
            vn = builder.load(pv, align=4)
            g = builder.load(vec1(9, v8f), align=4)
            gl = builder.load(vec1(10, v8d), align=8)
            zero = ir.Constant(v8i, [0] * 8)
            ext = (lambda x: builder.fpext(x, v8d)) if wide else (lambda x: x)
            OA, OR = [None] * 8, [None] * 8
            for s in range(7, -1, -1):
                rt, vt = R[s], V[s]
                delta = builder.fsub(builder.call(fma32, [g, vn, rt]), vt)
                x = builder.call(fma64, [gl, A, ext(delta)])
                if has_term:
                    y = ext(builder.fsub(rt, vt))
                    A = builder.select(builder.icmp_unsigned("!=", D[s], zero), y, x)
                else:
                    A = x
                o = builder.fptrunc(A, v8f) if wide else A
                OA[s] = o
                OR[s] = builder.fadd(o, vt)
                vn = vt
            builder.store(A, pa, align=8)
            builder.store(vn, pv, align=4)
            for k, cols in ((3, OA), (4, OR)):
                rowsv = _transpose8(builder, cols)
                for q in range(8):
                    builder.store(rowsv[q], rowptr(k, q, v8f, 4), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block


_blk_term = _make_block(True, True)
_blk_plain = _make_block(False, True)
_blk_term4 = _make_block(True, False)
_blk_plain4 = _make_block(False, False)


@njit(inline="always", fastmath=_FM)
def _gstep(rt, vt, vn, dt, g, gl, an):
    x = np.float64(rt + g * vn - vt) + gl * an
    y = np.float64(rt - vt)
    return y if dt else x


@njit(parallel=True, fastmath=_FM)
def gae8(r, v, d, has_term, gcol, lcol, bound, carry, adv, ret):
    R, T = r.shape
    tail = T % 8
    T8 = T - tail
    for grp in prange(R // 8):
        i0 = grp * 8
        sa = np.empty(8, np.float64)
        sv = np.empty(8, np.float32)
        g8 = np.empty(8, np.float32)
        gl8 = np.empty(8, np.float64)
        for q in range(8):
            i = i0 + q
            g = gcol[i]
            gl = np.float64(g) * np.float64(lcol[i])
            a = np.float64(carry[i])
            vn = bound[i]
            for j in range(tail):
                t = T - 1 - j
                x = v[i, t]
                a = _gstep(r[i, t], x, vn, has_term and d[i, t] != 0, g, gl, a)
                o = np.float32(a)
                adv[i, t] = o
                ret[i, t] = o + x
                vn = x
            sa[q] = a
            sv[q] = vn
            g8[q] = g
            gl8[q] = gl
        if has_term:
            for b in range(T8 // 8):
                _blk_term(r, v, d, adv, ret, i0, T8 - 8 * (b + 1), sa, sv, g8, gl8)
        else:
            for b in range(T8 // 8):
                _blk_plain(r, v, d, adv, ret, i0, T8 - 8 * (b + 1), sa, sv, g8, gl8)


@njit(inline="always", fastmath=_FM)
def _gstep4(rt, vt, vn, dt, g, gl, an):
    x = np.float32(rt + g * vn - vt) + gl * an
    y = np.float32(rt - vt)
    return y if dt else x


@njit(parallel=True, fastmath=_FM)
def gae8_f4(r, v, d, has_term, gcol, lcol, bound, carry, adv, ret):
    R, T = r.shape
    tail = T % 8
    T8 = T - tail
    for grp in prange(R // 8):
        i0 = grp * 8
        sa = np.empty(8, np.float32)
        sv = np.empty(8, np.float32)
        g8 = np.empty(8, np.float32)
        gl8 = np.empty(8, np.float32)
        for q in range(8):
            i = i0 + q
            g = gcol[i]
            gl = np.float32(g) * np.float32(lcol[i])
            a = np.float32(carry[i])
            vn = bound[i]
            for j in range(tail):
                t = T - 1 - j
                x = v[i, t]
                a = _gstep4(r[i, t], x, vn, has_term and d[i, t] != 0, g, gl, a)
                o = np.float32(a)
                adv[i, t] = o
                ret[i, t] = o + x
                vn = x
            sa[q] = a
            sv[q] = vn
            g8[q] = g
            gl8[q] = gl
        if has_term:
            for b in range(T8 // 8):
                _blk_term4(r, v, d, adv, ret, i0, T8 - 8 * (b + 1), sa, sv, g8, gl8)
        else:
            for b in range(T8 // 8):
                _blk_plain4(r, v, d, adv, ret, i0, T8 - 8 * (b + 1), sa, sv, g8, gl8)


def _check():
    import gaescan

    rng = np.random.default_rng(1)
    for gamma, lam, fn in ((0.999, 0.999, gae8), (0.99, 0.95, gae8_f4)):
        for R, T in ((8, 1), (8, 7), (16, 8), (8, 9), (24, 131), (8, 1024)):
            r = rng.standard_normal((R, T), dtype=np.float32)
            v = rng.standard_normal((R, T), dtype=np.float32)
            d = rng.random((R, T)) < 0.05
            for has in (True, False):
                res = gaescan.gae(r, v, terminated=d if has else None, gamma=gamma, lam=lam)
                adv, ret = np.empty_like(r), np.empty_like(r)
                fn(r, v, d.view(np.uint8), has, np.full(R, gamma, np.float32), np.full(R, lam, np.float32),
                   np.zeros(R, np.float32), np.zeros(R, np.float32), adv, ret)
                if not (np.array_equal(res.advantages.view(np.uint32), adv.view(np.uint32))
                        and np.array_equal(res.returns.view(np.uint32), ret.view(np.uint32))):
                    raise SystemExit(f"candidate differs from gaescan.gae: gamma={gamma} R={R} T={T} dones={has}")
    print("bits: identical to gaescan.gae on 48 cases (T = 1, 7, 8, 9, 131, 1024; both state widths)")


def main():
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_bench import _median, _triad_bw, machine

    import gaescan

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    rep = ap.parse_args().repeat
    rounds = ap.parse_args().rounds
    _check()
    R, T = 256, 131072
    rng = np.random.default_rng(0)
    r = rng.standard_normal((R, T), dtype=np.float32)
    v = rng.standard_normal((R, T), dtype=np.float32)
    d = rng.random((R, T)) < 0.01
    adv, ret = np.empty_like(r), np.empty_like(r)
    adv2, ret2 = np.empty_like(r), np.empty_like(r)
    z = np.zeros(R, np.float32)
    print(machine())
    print(f"[{R}, {T}] float32, medians of {rep}; x triad = bytes moved / time / triad GB/s of the same round")
    for _ in range(rounds):
        tri = _triad_bw(R * T, rep)
        for gamma, lam, fn in ((0.99, 0.95, gae8_f4), (0.999, 0.999, gae8)):
            gcol, lcol = np.full(R, gamma, np.float32), np.full(R, lam, np.float32)
            for has in (True, False):
                nbytes = R * T * (16 + (1 if has else 0))
                t0 = _median(lambda has=has, gamma=gamma, lam=lam: gaescan.gae(r, v, terminated=d if has else None, gamma=gamma, lam=lam,
                                                 out=(adv2, ret2)), rep)
                t1 = _median(lambda fn=fn, has=has, gcol=gcol, lcol=lcol: fn(r, v, d.view(np.uint8), has, gcol, lcol, z, z, adv, ret), rep)
                print(f"triad {tri:5.1f} GB/s  gamma={gamma} lam={lam} dones={has!s:5}: "
                      f"default {t0 * 1e3:6.1f} ms ({nbytes / t0 / 1e9 / tri:.2f}x triad)  "
                      f"vec8 {t1 * 1e3:6.1f} ms ({nbytes / t1 / 1e9 / tri:.2f}x triad)  default/vec8 {t0 / t1:.2f}")


if __name__ == "__main__":
    main()
