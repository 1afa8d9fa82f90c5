"""Vectors for Numba kernels on AArch64 (NEON with the dot-product extension): the same names
and semantics as simd/avx2.py, so the NEON kernels keep the AVX2 kernels' 8-row halves.

    F32x8  = <8 x float>   eight float32 lanes: two 128-bit q registers once LLVM legalizes it
    I32x8  = <8 x i32>     eight int32 lanes, also the view of 32 bytes (four per lane)

Everything except the byte dot products is plain LLVM vector IR with no x86 intrinsic in it
(loads, stores, fadd/fmul, maxnum/minnum, rint, fpext/fptrunc between half and float, the
lane-ordered reductions), so it is shared with simd/avx2.py rather than written twice; on
AArch64 LLVM lowers it to NEON (fcvtl/fcvtn for f16, frintx, fmaxnm, ...).  As there, float
ops carry no fast-math flags: a lane computes bit for bit what the scalar expression computes.

The dot products use SDOT (llvm.aarch64.neon.sdot: per 32-bit lane, the sum of four s8 x s8
products), applied to each 128-bit half.  SDOT is signed on both sides, so:
- 4-bit codes (0..15) are already valid s8 operands: vdpbusd is exact;
- 8-bit weights stored as w + 128 (quants/tiles.py) are flipped back to w by xor 0x80, and
  the kernel subtracts no offset (q8_offset = 0), exactly like the AVX2 pair path.
Valid where the host has NEON + dotprod (isa.py): optional from ARMv8.2-A, mandatory from
ARMv8.4-A (Cortex-A55/A75 and later, Neoverse N1 / Graviton2 and later, Apple M1 and later).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .avx2 import (  # noqa: F401  (re-exported: the target-independent vector ops)
    F32x8Type,
    I32x8Type,
    f32x8,
    i32x8,
    sround_f16,
    vabs,
    vadd,
    vadd_i32,
    vbcast4,
    vcvt_f32,
    vdiv,
    vexp,
    vhmax,
    vhsum,
    vhsum_i32,
    vlane,
    vload_bytes,
    vload_f16,
    vload_f32,
    vmax,
    vmin,
    vmul,
    vnib_hi,
    vnib_lo,
    vpow2_i32,
    vround_f16,
    vround_i32,
    vsplat_f32,
    vsplat_i32,
    vstore_f16,
    vstore_f32,
    vstore_i8,
    vsub,
    vsub_i32,
    vzero_f32,
    vzero_i32,
)

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
V4I = ir.VectorType(_I32, 4)
V8I = ir.VectorType(_I32, 8)
V16B = ir.VectorType(_I8, 16)
V32B = ir.VectorType(_I8, 32)
SDOT = "llvm.aarch64.neon.sdot.v4i32.v16i8"

_LOW = ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3])
_HIGH = ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7])
_LOW_B = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
_HIGH_B = ir.Constant(ir.VectorType(_I32, 16), list(range(16, 32)))
_BOTH = ir.Constant(ir.VectorType(_I32, 8), list(range(8)))


def _sdot(builder, acc, a, b):
    """acc (<8 x i32>) += per lane sum of four s8 x s8 products of a, b (<32 x i8>): one
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


@intrinsic
def vdpbusd(typingctx, isa, acc, u, s):
    """acc[l] += sum over k<4 of u(bytes 4l+k) * s8(s bytes 4l+k), for u bytes <= 127 (4-bit
    codes; the AVX2 name, so the kernels read alike).  `isa` is unused on NEON."""
    def codegen(context, builder, sig, args):
        _, a, uu, ss = args
        return _sdot(builder, a, builder.bitcast(uu, V32B), builder.bitcast(ss, V32B))
    return i32x8(isa, i32x8, i32x8, i32x8), codegen


@intrinsic
def vdot_q8(typingctx, isa, acc, u, s):
    """8-bit weights stored as w + 128 (unsigned bytes u) against int8 activations s:
    acc += sum w * s (u xor 0x80 is w as s8), so the kernel's offset is q8_offset = 0."""
    def codegen(context, builder, sig, args):
        _, a, uu, ss = args
        w = builder.xor(builder.bitcast(uu, V32B), ir.Constant(V32B, [0x80] * 32))
        return _sdot(builder, a, w, builder.bitcast(ss, V32B))
    return i32x8(isa, i32x8, i32x8, i32x8), codegen


@intrinsic
def q8_offset(typingctx, isa):
    """The code offset the kernel subtracts for 8-bit weights after vdot_q8: none."""
    return types.int64(isa), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(64), 0)
