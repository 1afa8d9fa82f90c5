"""Vectors of any width for Numba kernels: two Numba types backed by LLVM vector registers and
intrinsics that emit vector IR, inlined into ordinary @njit(cache=True) kernels, so each kernel
is written once for every vector path.

    F32Vec(n) = <n x float>   n float32 lanes (one output row of a weight tile each)
    I32Vec(n) = <n x i32>     n int32 lanes; also the view of 4n bytes that the byte dot
                              products (simd/dot.py) read, four bytes per lane

The width comes from the kernel's IsaType (isa.py: 16 lanes on avx512, 8 on avx2 and neon):
constructors and loads take it first, everything else is typed from its operands, so a kernel
compiled for one IsaType is the code the per-width twins used to be, and each ISA compiles and
caches its own specialization.  Loads take an array and a flat element offset into its
C-contiguous data (no bounds checks: callers own the index math).  Float ops are plain
fadd/fmul without fast-math flags, so a lane computes bit for bit what the same scalar
expression computes.  Only the byte dot products depend on the instruction set; the rest is
target-independent LLVM IR (LLVM lowers <8 x float> to two q registers on AArch64, f16
conversion to vcvtph2ps / fcvtl, maxnum to vmaxps / fmaxnm, ...).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

from ..isa import IsaType

F32 = ir.FloatType()
I32 = ir.IntType(32)
I8 = ir.IntType(8)
HALF = ir.HalfType()


class F32Vec(types.Type):
    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__(name=f"F32x{lanes}")


class I32Vec(types.Type):
    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__(name=f"I32x{lanes}")


@register_model(F32Vec)
class _F32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(F32, fe_type.lanes))


@register_model(I32Vec)
class _I32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(I32, fe_type.lanes))


def width(isa) -> int:
    """The lane count of a kernel's IsaType; a clear typing error for anything else."""
    if not isinstance(isa, IsaType) or not isa.lanes:
        raise TypingError(f"vector kernels need a vector IsaType (avx512, avx2, neon), not {isa}")
    return isa.lanes


def vec(ty: F32Vec | I32Vec, element: ir.Type = F32) -> ir.VectorType:
    return ir.VectorType(element, ty.lanes)


def ptr(context, builder, arrty, arr, off, vec_ty):
    """Address of element `off` of arr's data, as a pointer to vec_ty."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), vec_ty.as_pointer())


def _splat(builder, scalar, vec_ty):
    undef = ir.Constant(vec_ty, ir.Undefined)
    one = builder.insert_element(undef, scalar, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, vec_ty.count), None))


def call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, args)


# ---- constructors and loads: the width from the IsaType ------------------------------------

@intrinsic
def lanes(typingctx, isa):
    """The lane count, a compile-time constant (loop strides, tile geometry)."""
    n = width(isa)
    return types.intp(isa), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(64), n)


def _constant(kind: type, element: ir.Type):
    """An intrinsic (isa) -> the zero vector of class kind at the IsaType's width."""
    def typer(typingctx, isa):
        ty = kind(width(isa))
        return ty(isa), lambda ctx, b, sig, args: ir.Constant(vec(ty, element), None)
    return intrinsic(typer)


def _splat_of(kind: type, element: ir.Type, scalar):
    """An intrinsic (isa, x) -> x (cast to `scalar`) in every lane."""
    def typer(typingctx, isa, x):
        ty = kind(width(isa))

        def codegen(context, builder, sig, args):
            return _splat(builder, context.cast(builder, args[1], sig.args[1], scalar),
                          vec(ty, element))
        return ty(isa, x), codegen
    return intrinsic(typer)


vzero_f32 = _constant(F32Vec, F32)
vzero_i32 = _constant(I32Vec, I32)
vsplat_f32 = _splat_of(F32Vec, F32, types.float32)
vsplat_i32 = _splat_of(I32Vec, I32, types.int32)


@intrinsic
def vbcast4(typingctx, isa, arr, off):
    """Bytes off..off+3 of an int8/uint8 array, as one int32 repeated in every lane."""
    ty = I32Vec(width(isa))

    def codegen(context, builder, sig, args):
        p = ptr(context, builder, sig.args[1], args[1], args[2], I32)
        return _splat(builder, builder.load(p, align=1), vec(ty, I32))
    return ty(isa, arr, types.intp), codegen


def _load(kind: type, element: ir.Type, align: int):
    """An intrinsic (isa, arr, off) -> one vector of `element`s from element `off` of arr's
    data (f16 ones widened exactly to float32, one vcvtph2ps)."""
    def typer(typingctx, isa, arr, off):
        ty = kind(width(isa))

        def codegen(context, builder, sig, args):
            p = ptr(context, builder, sig.args[1], args[1], args[2], vec(ty, element))
            v = builder.load(p, align=align)
            return builder.fpext(v, vec(ty)) if element is HALF else v
        return ty(isa, arr, types.intp), codegen
    return intrinsic(typer)


# 4 x lanes bytes of a uint8/int8 array from byte `off`, four bytes per lane
vload_bytes = _load(I32Vec, I32, 1)
vload_f32 = _load(F32Vec, F32, 4)
# lanes f16 bit patterns (a uint16 array) from `off`, as float32
vload_f16 = _load(F32Vec, HALF, 2)


# ---- stores and lanes: typed from the vector ------------------------------------------------

def _store(kind: type, element: ir.Type, align: int):
    """An intrinsic (arr, off, v) storing vector v as `element`s at element `off` of arr's
    data: float32 as is, f16 rounded to nearest even (vcvtps2ph) into a uint16 array, int8
    the low byte of each int32 lane (values in -128..127, vpmovdb)."""
    def typer(typingctx, arr, off, v):
        if not isinstance(v, kind):
            return None

        def codegen(context, builder, sig, args):
            to = vec(v, element)
            x = args[2]
            if element is HALF:
                x = builder.fptrunc(x, to)
            elif element is I8:
                x = builder.trunc(x, to)
            builder.store(x, ptr(context, builder, sig.args[0], args[0], args[1], to),
                          align=align)
            return context.get_dummy_value()
        return types.none(arr, types.intp, v), codegen
    return intrinsic(typer)


vstore_f32 = _store(F32Vec, F32, 4)
vstore_f16 = _store(F32Vec, HALF, 2)
vstore_i8 = _store(I32Vec, I8, 1)
# the 4 x lanes bytes of an int32 vector as they are, into a uint8/int8 array at byte `off`
vstore_bytes = _store(I32Vec, I32, 1)


@intrinsic
def vlane(typingctx, v, i):
    """Lane i of a vector, as a scalar."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    return (types.float32 if isinstance(v, F32Vec) else types.int32)(v, i), codegen
