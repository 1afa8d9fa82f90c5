"""A software prefetch for Numba kernels (llvm.prefetch: a hint, any ISA, never faults).

Batched matmuls take a weight tile from memory once and then spend a while on it in L1; the
hardware prefetcher does not see far enough past the tile boundary, so the kernels ask for the
next tile's lines while they work on the current one.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)


@intrinsic
def prefetch(typingctx, arr, off):
    """Hint: the cache line holding element `off` of arr's C-contiguous data (read, keep in
    all cache levels).  No bounds check: an address past the end is harmless for a hint."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), _I8P)
        fnty = ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # rw = 0 (read), locality = 3 (keep), cache type = 1 (data)
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(arr, types.intp), codegen
