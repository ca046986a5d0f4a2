"""16-byte global loads and stores for the CUDA kernels (``OPT_VECTOR``).

:func:`ldg_vec` reads the ``16 // itemsize`` consecutive elements
``x[i, j] .. x[i, j + n - 1]`` of a 2-D float32 or float64 array with one
``ld.global.nc.v4.f32`` / ``ld.global.nc.v2.f64`` and returns them as a tuple;
:func:`stg_vec` writes such a tuple with one ``st.global.v4.f32`` /
``st.global.v2.f64``.  Both are inline PTX (numba-cuda intrinsics), with the
address computed from the array's strides as an indexed access computes it.

The instructions fault unless the address is a multiple of 16 bytes and the
elements are consecutive in memory (time stride = itemsize): the kernels call
them only when the backend has checked that (see
:func:`gaescan.backends.cuda.vector_ok`).  The ``.nc`` load reads through the
read-only data cache, which is valid because the kernels never write an array
they read (outputs overlap no input).

In Numba's CUDA simulator, which cannot run intrinsics, the same names are
plain functions doing the scalar reads and writes, so the kernel source is the
same on both.
"""

from __future__ import annotations

from numba.core import config as _numba_config

#: The elements of one 16-byte access, by itemsize.
VECTOR_BYTES = 16


def lanes(itemsize: int) -> int:
    """Elements per 16-byte access of an array of ``itemsize``-byte elements (float32: 4, float64: 2)."""
    return VECTOR_BYTES // int(itemsize)


if _numba_config.ENABLE_CUDASIM:

    def ldg_vec(x, i, j):
        """``(x[i, j], ..., x[i, j + n - 1])``, ``n = 16 // itemsize`` (scalar reads)."""
        n = lanes(x.dtype.itemsize)
        return tuple(x[i, j + c] for c in range(n))

    def stg_vec(x, i, j, vals):
        """``x[i, j + c] = vals[c]`` for each element of the tuple ``vals`` (scalar writes)."""
        for c in range(len(vals)):
            x[i, j + c] = vals[c]

else:
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError

    try:
        from numba.cuda import cgutils
        from numba.cuda.extending import intrinsic
    except ImportError:  # pragma: no cover - Numba's built-in CUDA target
        from numba.core import cgutils
        from numba.core.extending import intrinsic

    _PTX = {  # element type -> (PTX type suffix, inline-asm register constraint)
        "float32": ("f32", "f"),
        "float64": ("f64", "d"),
    }

    def _check(name, x):
        if not (isinstance(x, types.Array) and x.ndim == 2 and str(x.dtype) in _PTX):
            raise TypingError(f"{name} takes a 2-D float32 or float64 array, got {x}")

    def _address(context, builder, xty, x, i, ity, j, jty):
        ary = context.make_array(xty)(context, builder, value=x)
        idx = [context.cast(builder, i, ity, types.intp), context.cast(builder, j, jty, types.intp)]
        return cgutils.get_item_pointer(context, builder, xty, ary, idx, wraparound=False)

    @intrinsic
    def ldg_vec(typingctx, x, i, j):
        """``(x[i, j], ..., x[i, j + n - 1])`` with one ``ld.global.nc.v{n}`` (16 bytes, aligned)."""
        _check("ldg_vec", x)
        n = lanes(x.dtype.bitwidth // 8)
        sig = types.UniTuple(x.dtype, n)(x, i, j)

        def codegen(context, builder, sig, args):
            xty, ity, jty = sig.args
            ptr = _address(context, builder, xty, args[0], args[1], ity, args[2], jty)
            suffix, reg = _PTX[str(xty.dtype)]
            elt = context.get_value_type(xty.dtype)
            fnty = ir.FunctionType(ir.LiteralStructType([elt] * n), [ptr.type])
            outs = ", ".join(f"${c}" for c in range(n))
            # No side effect and no memory clobber: the data is read-only for the
            # kernel, so the load may be scheduled like any other load.
            asm = ir.InlineAsm(fnty, f"ld.global.nc.v{n}.{suffix} {{{outs}}}, [${n}];",
                               ",".join([f"={reg}"] * n + ["l"]))
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, c) for c in range(n)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def stg_vec(typingctx, x, i, j, vals):
        """``x[i, j + c] = vals[c]`` with one ``st.global.v{n}`` (16 bytes, aligned)."""
        _check("stg_vec", x)
        n = lanes(x.dtype.bitwidth // 8)
        if not (isinstance(vals, types.UniTuple) and vals.count == n):
            raise TypingError(f"stg_vec: {n} values for a {x.dtype} array, got {vals}")
        sig = types.void(x, i, j, vals)

        def codegen(context, builder, sig, args):
            xty, ity, jty, vty = sig.args
            ptr = _address(context, builder, xty, args[0], args[1], ity, args[2], jty)
            suffix, reg = _PTX[str(xty.dtype)]
            elt = context.get_value_type(xty.dtype)
            vals = [context.cast(builder, builder.extract_value(args[3], c), vty.dtype, xty.dtype)
                    for c in range(n)]
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type] + [elt] * n)
            ins = ", ".join(f"${c + 1}" for c in range(n))
            asm = ir.InlineAsm(fnty, f"st.global.v{n}.{suffix} [$0], {{{ins}}};",
                               ",".join(["l"] + [reg] * n + ["~{memory}"]), side_effect=True)
            builder.call(asm, [ptr] + vals)
            return context.get_dummy_value()

        return sig, codegen
