"""Dynamic row scheduling for the quantization kernels.

`prange` over rows hands each thread a fixed, equal slice up front (static scheduling), so on a
busy machine — or with rows of unequal cost — the whole call waits for the slowest slice. The
kernels instead start workers and let each claim the next row from a shared
counter (an atomic fetch-and-add), so a thread that falls behind simply claims fewer rows:

    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        scratch = ...                  # once per worker
        r = claim(nxt)
        while r < n_rows:
            ...quantize row r...
            r = claim(nxt)

WORKERS is a constant at least the thread count (numba's get_num_threads() inside a kernel
would stop it from caching): prange splits the workers statically, the first worker on each
thread drains the rows and the others find none left. Rows are claimed one at a time: a row
of even 256 values costs microseconds, the atomic add nanoseconds. The bytes written do not
depend on which thread quantizes which row.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


@intrinsic
def claim(typingctx, counter):  # type: ignore[no-untyped-def]
    """Atomically increment counter[0] (an int64 array) and return its previous value."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", ary.data, one, "monotonic")

    return sig, codegen


WORKERS = 256  # >= any thread count we run with

__all__ = ["WORKERS", "claim"]
