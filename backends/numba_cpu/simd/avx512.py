"""512-bit vectors for Numba kernels: two Numba types backed by LLVM vector registers and
intrinsics that emit vector IR, inlined into ordinary @njit(cache=True) kernels.

    F32x16  = <16 x float>   sixteen float32 lanes (one output row of a weight tile each)
    I32x16  = <16 x i32>     sixteen int32 lanes; also the view of 64 bytes (<64 x i8>) that
                             vpdpbusd reads, four bytes per lane

LLVM does not turn Numba loops over 32-element quant blocks into VNNI code, so the kernels say
what they mean.  Loads take an array and a flat element offset into its C-contiguous data (no
bounds checks: callers own the index math).  Float ops are plain fadd/fmul without fast-math
flags, so a vector lane computes bit for bit what the same scalar expression computes.
Only valid where the host has AVX-512 F/BW/VNNI (see dispatch.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
V16F = ir.VectorType(_F32, 16)
V16I = ir.VectorType(_I32, 16)


class F32x16Type(types.Type):
    def __init__(self) -> None:
        super().__init__(name="F32x16")


class I32x16Type(types.Type):
    def __init__(self) -> None:
        super().__init__(name="I32x16")


f32x16 = F32x16Type()
i32x16 = I32x16Type()


@register_model(F32x16Type)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V16F)


@register_model(I32x16Type)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V16I)


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
    return f32x16(), lambda ctx, b, sig, args: ir.Constant(V16F, None)


@intrinsic
def vzero_i32(typingctx):
    return i32x16(), lambda ctx, b, sig, args: ir.Constant(V16I, None)


@intrinsic
def vsplat_f32(typingctx, x):
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), V16F)
    return f32x16(x), codegen


@intrinsic
def vsplat_i32(typingctx, x):
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), V16I)
    return i32x16(x), codegen


@intrinsic
def vload_bytes(typingctx, arr, off):
    """64 bytes of a uint8/int8 array from byte `off` -> I32x16 (four bytes per lane)."""
    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], V16I), align=1)
    return i32x16(arr, types.intp), codegen


@intrinsic
def vbcast4(typingctx, arr, off):
    """Bytes off..off+3 of an int8/uint8 array, as one int32 repeated in all 16 lanes."""
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I32)
        return _splat(builder, builder.load(p, align=1), V16I)
    return i32x16(arr, types.intp), codegen


@intrinsic
def vload_f32(typingctx, arr, off):
    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], V16F), align=4)
    return f32x16(arr, types.intp), codegen


@intrinsic
def vload_f16(typingctx, arr, off):
    """Sixteen f16 bit patterns (uint16 array) from `off`, widened exactly to F32x16
    (one vcvtph2ps)."""
    def codegen(context, builder, sig, args):
        half = ir.VectorType(ir.HalfType(), 16)
        h = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], half), align=2)
        return builder.fpext(h, V16F)
    return f32x16(arr, types.intp), codegen


@intrinsic
def vstore_f32(typingctx, arr, off, v):
    def codegen(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], V16F),
                      align=4)
        return context.get_dummy_value()
    return types.none(arr, types.intp, f32x16), codegen


@intrinsic
def vstore_f16(typingctx, arr, off, v):
    """Round F32x16 to f16 (nearest even, vcvtps2ph) and store the bits into a uint16 array."""
    def codegen(context, builder, sig, args):
        half = ir.VectorType(ir.HalfType(), 16)
        h = builder.fptrunc(args[2], half)
        builder.store(h, _ptr(context, builder, sig.args[0], args[0], args[1], half), align=2)
        return context.get_dummy_value()
    return types.none(arr, types.intp, f32x16), codegen


@intrinsic
def vlane(typingctx, v, i):
    """Lane i of a vector, as a scalar."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    ret = types.float32 if v == f32x16 else types.int32
    return ret(v, i), codegen


# ---- arithmetic -----------------------------------------------------------------------------

def _binary(ty, op):
    def typer(typingctx, a, b):
        if a != ty or b != ty:
            return None
        return ty(ty, ty), lambda ctx, builder, sig, args: getattr(builder, op)(*args)
    return intrinsic(typer)


vadd = _binary(f32x16, "fadd")
vsub = _binary(f32x16, "fsub")
vmul = _binary(f32x16, "fmul")
vadd_i32 = _binary(i32x16, "add")
vsub_i32 = _binary(i32x16, "sub")
vmul_i32 = _binary(i32x16, "mul")


@intrinsic
def vmax(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.maxnum.v16f32", V16F, list(args))
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def vcvt_f32(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2**24)."""
    return f32x16(i32x16), lambda ctx, builder, sig, args: builder.sitofp(args[0], V16F)


@intrinsic
def vround_i32(typingctx, v):
    """float32 lanes -> nearest int32 (ties to even)."""
    def codegen(context, builder, sig, args):
        r = _call(builder, "llvm.rint.v16f32", V16F, [args[0]])
        return builder.fptosi(r, V16I)
    return i32x16(f32x16), codegen


@intrinsic
def vpow2_i32(typingctx, n):
    """2**n for int32 lanes n in [-126, 127], built in the exponent field."""
    def codegen(context, builder, sig, args):
        biased = builder.add(args[0], ir.Constant(V16I, [127] * 16))
        return builder.bitcast(builder.shl(biased, ir.Constant(V16I, [23] * 16)), V16F)
    return f32x16(i32x16), codegen


@intrinsic
def vhmax(typingctx, v):
    """Largest lane."""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.vector.reduce.fmax.v16f32", _F32, [args[0]])
    return types.float32(f32x16), codegen


@intrinsic
def vhsum(typingctx, v):
    """Sum of the lanes in lane order (sequential, so the result is reproducible)."""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.vector.reduce.fadd.v16f32", _F32,
                     [ir.Constant(_F32, -0.0), args[0]])
    return types.float32(f32x16), codegen


# ---- bytes and VNNI -------------------------------------------------------------------------

_LOW4 = ir.Constant(V16I, [0x0F0F0F0F] * 16)


@intrinsic
def vnib_lo(typingctx, v):
    """Low nibble of each of the 64 bytes (0..15, as unsigned bytes)."""
    return i32x16(i32x16), lambda ctx, builder, sig, args: builder.and_(args[0], _LOW4)


@intrinsic
def vnib_hi(typingctx, v):
    """High nibble of each of the 64 bytes, moved down (0..15)."""
    def codegen(context, builder, sig, args):
        shifted = builder.lshr(args[0], ir.Constant(V16I, [4] * 16))
        return builder.and_(shifted, _LOW4)
    return i32x16(i32x16), codegen


@intrinsic
def vdpbusd(typingctx, acc, u, s):
    """acc[l] += sum over k<4 of u8(u bytes 4l+k) * s8(s bytes 4l+k): one vpdpbusd.

    The first byte operand is unsigned, the second signed; callers put 4-bit (or 128-offset
    8-bit) weight codes in `u` and int8 activations in `s`, and subtract the offset times the
    activation block sum afterwards — exact integer arithmetic."""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", V16I, list(args))
    return i32x16(i32x16, i32x16, i32x16), codegen


@intrinsic
def vround_f16(typingctx, v):
    """Round each lane to the nearest f16 value (ties to even), kept as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.VectorType(ir.HalfType(), 16)), V16F)
    return f32x16(f32x16), codegen


@intrinsic
def sround_f16(typingctx, x):
    """A scalar float32 rounded to the nearest f16 value (ties to even), as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)
    return types.float32(types.float32), codegen


@intrinsic
def vmin(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.minnum.v16f32", V16F, list(args))
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def vabs(typingctx, v):
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fabs.v16f32", V16F, [args[0]])
    return f32x16(f32x16), codegen


@intrinsic
def vdiv(typingctx, a, b):
    return f32x16(f32x16, f32x16), lambda ctx, builder, sig, args: builder.fdiv(*args)


@intrinsic
def vhsum_i32(typingctx, v):
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.vector.reduce.add.v16i32", _I32, [args[0]])
    return types.int32(i32x16), codegen


@intrinsic
def vstore_i8(typingctx, arr, off, v):
    """Store the low byte of each int32 lane (values in -128..127) as 16 int8s (vpmovdb)."""
    def codegen(context, builder, sig, args):
        b16 = ir.VectorType(ir.IntType(8), 16)
        builder.store(builder.trunc(args[2], b16),
                      _ptr(context, builder, sig.args[0], args[0], args[1], b16), align=1)
        return context.get_dummy_value()
    return types.none(arr, types.intp, i32x16), codegen
