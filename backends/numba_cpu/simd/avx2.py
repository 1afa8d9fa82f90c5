"""8-lane vectors for Numba kernels, the AVX2 counterpart of simd/avx512.py (same names, same
semantics, half the lanes), also compiled for AArch64 NEON (simd/neon.py):

    F32x8  = <8 x float>   eight float32 lanes (one output row of a half weight tile each)
    I32x8  = <8 x i32>     eight int32 lanes; also the view of 32 bytes (<32 x i8>), four bytes
                           per lane, for the byte dot products

Loads take an array and a flat element offset into its C-contiguous data (no bounds checks).
Float ops carry no fast-math flags, so a lane computes bit for bit what the scalar expression
computes.  Valid where the host has AVX2 + FMA + F16C, or NEON + dotprod (isa.py): everything
but the byte dot products is target-independent LLVM IR.

The byte dot products take the kernel's IsaType first: its `vnni` flag picks, at compile time,
vpdpbusd ymm (AVX-VNNI, or AVX-512 VNNI + VL) or the AVX2 pair vpmaddubsw + vpmaddwd.  The pair
sums two u8 x s8 products into a saturating int16 first, so it is exact only while those sums
fit: 4-bit codes (<= 15) against int8 activations always do; 8-bit weights go through
vdot_q8, which uses the sign trick instead (|w| against sign(w) * x, both fit).  An IsaType
named neon makes them SDOT instead (simd/neon.py), so kernels/*_avx2.py serve both ISAs.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from . import neon
from .vexp import COEFFS, LN2_HI, LN2_LO, LOG2E

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_I8 = ir.IntType(8)
V8F = ir.VectorType(_F32, 8)
V8I = ir.VectorType(_I32, 8)
V16S = ir.VectorType(_I16, 16)
V32B = ir.VectorType(_I8, 32)


class F32x8Type(types.Type):
    def __init__(self) -> None:
        super().__init__(name="F32x8")


class I32x8Type(types.Type):
    def __init__(self) -> None:
        super().__init__(name="I32x8")


f32x8 = F32x8Type()
i32x8 = I32x8Type()


@register_model(F32x8Type)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V8F)


@register_model(I32x8Type)
class _I32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V8I)


def _ptr(context, builder, arrty, arr, off, vec_ty):
    """Address of element `off` of arr's data, as a pointer to vec_ty."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), vec_ty.as_pointer())


def _splat(builder, scalar, vec_ty):
    undef = ir.Constant(vec_ty, ir.Undefined)
    one = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, vec_ty.count), None))


def _call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, args)


# ---- constructors and memory ----------------------------------------------------------------

@intrinsic
def vzero_f32(typingctx):
    return f32x8(), lambda ctx, b, sig, args: ir.Constant(V8F, None)


@intrinsic
def vzero_i32(typingctx):
    return i32x8(), lambda ctx, b, sig, args: ir.Constant(V8I, None)


@intrinsic
def vsplat_f32(typingctx, x):
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), V8F)
    return f32x8(x), codegen


@intrinsic
def vsplat_i32(typingctx, x):
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), V8I)
    return i32x8(x), codegen


@intrinsic
def vload_bytes(typingctx, arr, off):
    """32 bytes of a uint8/int8 array from byte `off` -> I32x8 (four bytes per lane)."""
    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], V8I), align=1)
    return i32x8(arr, types.intp), codegen


@intrinsic
def vbcast4(typingctx, arr, off):
    """Bytes off..off+3 of an int8/uint8 array, as one int32 repeated in all 8 lanes."""
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I32)
        return _splat(builder, builder.load(p, align=1), V8I)
    return i32x8(arr, types.intp), codegen


@intrinsic
def vload_f32(typingctx, arr, off):
    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], V8F), align=4)
    return f32x8(arr, types.intp), codegen


@intrinsic
def vload_f16(typingctx, arr, off):
    """Eight f16 bit patterns (uint16 array) from `off`, widened exactly (one vcvtph2ps)."""
    def codegen(context, builder, sig, args):
        half = ir.VectorType(ir.HalfType(), 8)
        h = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], half), align=2)
        return builder.fpext(h, V8F)
    return f32x8(arr, types.intp), codegen


@intrinsic
def vstore_f32(typingctx, arr, off, v):
    def codegen(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], V8F),
                      align=4)
        return context.get_dummy_value()
    return types.none(arr, types.intp, f32x8), codegen


@intrinsic
def vstore_f16(typingctx, arr, off, v):
    """Round F32x8 to f16 (nearest even, vcvtps2ph) and store the bits into a uint16 array."""
    def codegen(context, builder, sig, args):
        half = ir.VectorType(ir.HalfType(), 8)
        h = builder.fptrunc(args[2], half)
        builder.store(h, _ptr(context, builder, sig.args[0], args[0], args[1], half), align=2)
        return context.get_dummy_value()
    return types.none(arr, types.intp, f32x8), codegen


@intrinsic
def vstore_i8(typingctx, arr, off, v):
    """Store the low byte of each int32 lane (values in -128..127) as 8 int8s."""
    def codegen(context, builder, sig, args):
        b8 = ir.VectorType(_I8, 8)
        builder.store(builder.trunc(args[2], b8),
                      _ptr(context, builder, sig.args[0], args[0], args[1], b8), align=1)
        return context.get_dummy_value()
    return types.none(arr, types.intp, i32x8), codegen


@intrinsic
def vlane(typingctx, v, i):
    """Lane i of a vector, as a scalar."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    ret = types.float32 if v == f32x8 else types.int32
    return ret(v, i), codegen


# ---- arithmetic -----------------------------------------------------------------------------

def _binary(ty, op):
    def typer(typingctx, a, b):
        if a != ty or b != ty:
            return None
        return ty(ty, ty), lambda ctx, builder, sig, args: getattr(builder, op)(*args)
    return intrinsic(typer)


vadd = _binary(f32x8, "fadd")
vsub = _binary(f32x8, "fsub")
vmul = _binary(f32x8, "fmul")
vdiv = _binary(f32x8, "fdiv")
vadd_i32 = _binary(i32x8, "add")
vsub_i32 = _binary(i32x8, "sub")


def _unary_call(name, ret_ty, ret_ir, arg_ty):
    def typer(typingctx, v):
        def codegen(context, builder, sig, args):
            return _call(builder, name, ret_ir, list(args))
        return ret_ty(arg_ty), codegen
    return intrinsic(typer)


@intrinsic
def vmax(typingctx, a, b):
    return f32x8(f32x8, f32x8), lambda ctx, builder, sig, args: _call(
        builder, "llvm.maxnum.v8f32", V8F, list(args))


@intrinsic
def vmin(typingctx, a, b):
    return f32x8(f32x8, f32x8), lambda ctx, builder, sig, args: _call(
        builder, "llvm.minnum.v8f32", V8F, list(args))


vabs = _unary_call("llvm.fabs.v8f32", f32x8, V8F, f32x8)
vhmax = _unary_call("llvm.vector.reduce.fmax.v8f32", types.float32, _F32, f32x8)
vhsum_i32 = _unary_call("llvm.vector.reduce.add.v8i32", types.int32, _I32, i32x8)


@intrinsic
def vhsum(typingctx, v):
    """Sum of the lanes in lane order (sequential, so the result is reproducible)."""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.vector.reduce.fadd.v8f32", _F32,
                     [ir.Constant(_F32, -0.0), args[0]])
    return types.float32(f32x8), codegen


@intrinsic
def vcvt_f32(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2**24)."""
    return f32x8(i32x8), lambda ctx, builder, sig, args: builder.sitofp(args[0], V8F)


@intrinsic
def vround_i32(typingctx, v):
    """float32 lanes -> nearest int32 (ties to even)."""
    def codegen(context, builder, sig, args):
        return builder.fptosi(_call(builder, "llvm.rint.v8f32", V8F, [args[0]]), V8I)
    return i32x8(f32x8), codegen


@intrinsic
def vpow2_i32(typingctx, n):
    """2**n for int32 lanes n in [-126, 127], built in the exponent field."""
    def codegen(context, builder, sig, args):
        biased = builder.add(args[0], ir.Constant(V8I, [127] * 8))
        return builder.bitcast(builder.shl(biased, ir.Constant(V8I, [23] * 8)), V8F)
    return f32x8(i32x8), codegen


@intrinsic
def vround_f16(typingctx, v):
    """Round each lane to the nearest f16 value (ties to even), kept as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.VectorType(ir.HalfType(), 8)), V8F)
    return f32x8(f32x8), codegen


@intrinsic
def sround_f16(typingctx, x):
    """A scalar float32 rounded to the nearest f16 value (ties to even), as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)
    return types.float32(types.float32), codegen


# ---- bytes and dot products -----------------------------------------------------------------

_LOW4 = ir.Constant(V8I, [0x0F0F0F0F] * 8)


@intrinsic
def vnib_lo(typingctx, v):
    """Low nibble of each of the 32 bytes (0..15, as unsigned bytes)."""
    return i32x8(i32x8), lambda ctx, builder, sig, args: builder.and_(args[0], _LOW4)


@intrinsic
def vnib_hi(typingctx, v):
    """High nibble of each of the 32 bytes, moved down (0..15)."""
    def codegen(context, builder, sig, args):
        return builder.and_(builder.lshr(args[0], ir.Constant(V8I, [4] * 8)), _LOW4)
    return i32x8(i32x8), codegen


def _madd_pair(builder, u, s):
    """Per lane, sum over its 4 bytes of u8(u) * s8(s), via vpmaddubsw (pairs into saturating
    int16) and vpmaddwd against ones (pairs of int16 into int32)."""
    p16 = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", V16S,
                [builder.bitcast(u, V32B), builder.bitcast(s, V32B)])
    return _call(builder, "llvm.x86.avx2.pmadd.wd", V8I, [p16, ir.Constant(V16S, [1] * 16)])


def _vnni(isa) -> bool:
    return bool(getattr(isa, "vnni", False))


def _neon(isa) -> bool:
    return getattr(isa, "isa", "") == "neon"


@intrinsic
def vdpbusd(typingctx, isa, acc, u, s):
    """acc[l] += sum over k<4 of u8(u bytes 4l+k) * s8(s bytes 4l+k).  Exact when every pair
    sum fits int16 on the AVX2 fallback (u <= 128 against |s| <= 127: 4-bit codes do)."""
    vnni, on_neon = _vnni(isa), _neon(isa)

    def codegen(context, builder, sig, args):
        _, a, uu, ss = args
        if on_neon:
            return neon.sdot_u4(builder, a, uu, ss)
        if vnni:
            return _call(builder, "llvm.x86.avx512.vpdpbusd.256", V8I, [a, uu, ss])
        return builder.add(a, _madd_pair(builder, uu, ss))
    return i32x8(isa, i32x8, i32x8, i32x8), codegen


@intrinsic
def vdot_q8(typingctx, isa, acc, u, s):
    """8-bit weights stored as w + 128 (unsigned bytes u) against int8 activations s.
    VNNI: acc += sum u * s (offset included; the kernel subtracts 128 * sum s per block).
    AVX2: acc += sum w * s (no offset: |w| against sign(w) * s keeps every pair sum below
    2 * 128 * 127 < 2**15), so the kernel's offset is q8_offset(isa) = 0 there."""
    vnni, on_neon = _vnni(isa), _neon(isa)

    def codegen(context, builder, sig, args):
        _, a, uu, ss = args
        if on_neon:
            return neon.sdot_q8(builder, a, uu, ss)
        if vnni:
            return _call(builder, "llvm.x86.avx512.vpdpbusd.256", V8I, [a, uu, ss])
        w = builder.xor(builder.bitcast(uu, V32B), ir.Constant(V32B, [0x80] * 32))
        aw = _call(builder, "llvm.abs.v32i8", V32B, [w, ir.Constant(ir.IntType(1), 0)])
        sx = _call(builder, "llvm.x86.avx2.psign.b", V32B, [builder.bitcast(ss, V32B), w])
        return builder.add(a, _madd_pair(builder, aw, sx))
    return i32x8(isa, i32x8, i32x8, i32x8), codegen


@intrinsic
def q8_offset(typingctx, isa):
    """The code offset the kernel subtracts for 8-bit weights after vdot_q8 (128 or 0; never
    on neon, whose vdot_q8 is a flip and SDOT)."""
    off = 128 if _vnni(isa) else 0
    return types.int64(isa), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(64), off)


# ---- exp ------------------------------------------------------------------------------------

@njit(nogil=True)
def vexp(x):
    """e**x over eight lanes, the same algorithm and constants as simd/vexp.py."""
    x = vmin(vmax(x, vsplat_f32(np.float32(-87.0))), vsplat_f32(np.float32(88.0)))
    n = vround_i32(vmul(x, vsplat_f32(LOG2E)))
    nf = vcvt_f32(n)
    r = vsub(vsub(x, vmul(nf, vsplat_f32(LN2_HI))), vmul(nf, vsplat_f32(LN2_LO)))
    p = vsplat_f32(COEFFS[0])
    for k in range(1, 7):
        p = vadd(vmul(p, r), vsplat_f32(COEFFS[k]))
    p = vadd(vmul(p, r), vsplat_f32(np.float32(1.0)))
    return vmul(p, vpow2_i32(n))
