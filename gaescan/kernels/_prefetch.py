"""Software prefetch intrinsics for the Numba CPU kernels.

The candidate build of the fused V-trace kernel with software prefetches
(``_PREFETCH = True`` in :mod:`gaescan.kernels.cpu_vtrace`) calls these from
``njit`` code.  A prefetch changes no arithmetic: a kernel gives the same
bits with or without its prefetches.

Attributes
----------
_LINE : int
    Bytes per cache line.
_prefetch_r, _prefetch_w : numba intrinsics
    ``_prefetch_r(ary, i, t)`` requests the cache line of ``ary[i, t]`` (a
    2-D array of any layout and strides) for reading, ``_prefetch_w`` for
    writing.  Neither checks bounds nor wraps negative indices: callers pass
    positions inside the array.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_LINE = 64    # bytes per cache line


def _prefetch_intrinsic(write: bool):
    """The intrinsic ``prefetch(ary, i, t)`` for the element ``ary[i, t]``: for
    writing if ``write``, else for reading."""
    # llvm.prefetch(ptr, rw, locality, cache = data).  Reads use locality 2
    # (``prefetcht1`` on x86: into L2, which holds the tiles in flight);
    # writes use locality 3, which x86 lowers to ``prefetchw`` (the line
    # arrives owned, so the store that follows needs no second request).
    rw, locality = (1, 3) if write else (0, 2)

    @intrinsic
    def prefetch(typingctx, ary, i, t):
        if not (isinstance(ary, types.Array) and ary.ndim == 2
                and isinstance(i, types.Integer) and isinstance(t, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            arr = context.make_array(ary)(context, builder, args[0])
            inds = [context.cast(builder, args[1], i, types.intp), context.cast(builder, args[2], t, types.intp)]
            ptr = cgutils.get_item_pointer2(context, builder, arr.data, cgutils.unpack_tuple(builder, arr.shape),
                                            cgutils.unpack_tuple(builder, arr.strides), ary.layout, inds,
                                            wraparound=False, boundscheck=False)
            i32 = ir.IntType(32)
            pty = cgutils.voidptr_t
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [pty, i32, i32, i32]),
                                                "llvm.prefetch." + pty.intrinsic_name)
            builder.call(fn, [builder.bitcast(ptr, pty), i32(rw), i32(locality), i32(1)])
            return context.get_dummy_value()

        return types.void(ary, i, t), codegen

    return prefetch


_prefetch_r = _prefetch_intrinsic(False)
_prefetch_w = _prefetch_intrinsic(True)
