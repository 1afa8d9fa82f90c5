"""The byte dot products on AArch64 (NEON with the dot-product extension), as LLVM IR for the
8-lane dot products of simd/dot.py: the vectors are plain LLVM vector IR except for the dot
products, so the 8-lane kernels compile unchanged for AArch64 (LLVM lowers <8 x float> to two
128-bit q registers, f16 conversion to fcvtl/fcvtn, maxnum to fmaxnm, ...) once vdpbusd /
vdot_q8 / q8_offset emit SDOT for an IsaType named neon.

SDOT (llvm.aarch64.neon.sdot: per 32-bit lane, the sum of four s8 x s8 products) is signed on
both sides, so:
- 4- and 5-bit codes (0..15, 0..31) are already valid s8 operands: vdpbusd and vdot4_part
  are exact;
- 8-bit weights stored as w + 128 (quants/tiles.py) are flipped back to w by xor 0x80, and
  the kernel subtracts no offset (q8_offset = 0), exactly like the AVX2 pair path.
Valid where the host has NEON + dotprod (isa.py): optional from ARMv8.2-A, mandatory from
ARMv8.4-A (Cortex-A55/A75 and later, Neoverse N1 / Graviton2 and later, Apple M1 and later).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
V4I = ir.VectorType(_I32, 4)
V16B = ir.VectorType(_I8, 16)
V32B = ir.VectorType(_I8, 32)
SDOT = "llvm.aarch64.neon.sdot.v4i32.v16i8"

_LOW = ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3])
_HIGH = ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7])
_LOW_B = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
_HIGH_B = ir.Constant(ir.VectorType(_I32, 16), list(range(16, 32)))
_BOTH = ir.Constant(ir.VectorType(_I32, 8), list(range(8)))


def sdot(builder, acc, a, b):
    """acc (<8 x i32>) + per lane sum of four s8 x s8 products of a, b (<32 x i8>): one
    SDOT per 128-bit half."""
    fnty = ir.FunctionType(V4I, [V4I, V16B, V16B])
    fn = cgutils.get_or_insert_function(builder.module, fnty, SDOT)
    halves = []
    for lanes, bytes_ in ((_LOW, _LOW_B), (_HIGH, _HIGH_B)):
        acc_h = builder.shuffle_vector(acc, acc, lanes)
        a_h = builder.shuffle_vector(a, a, bytes_)
        b_h = builder.shuffle_vector(b, b, bytes_)
        halves.append(builder.call(fn, [acc_h, a_h, b_h]))
    return builder.shuffle_vector(halves[0], halves[1], _BOTH)


def sdot_u4(builder, acc, u, s):
    """vdpbusd for 4- or 5-bit codes u (<= 127, so valid s8) against int8 s."""
    return sdot(builder, acc, builder.bitcast(u, V32B), builder.bitcast(s, V32B))


def sdot_q8(builder, acc, u, s):
    """vdot_q8: 8-bit weights stored as w + 128 (u) against int8 s: acc + sum w * s."""
    w = builder.xor(builder.bitcast(u, V32B), ir.Constant(V32B, [0x80] * 32))
    return sdot(builder, acc, w, builder.bitcast(s, V32B))
