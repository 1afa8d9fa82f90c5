"""Element-wise arithmetic, conversions and reductions on the vectors of simd/vectors.py, each
typed from its operands (any width, both operands the same type) and lowered to plain LLVM
vector IR: fadd/fmul without fast-math flags (a lane computes what the scalar expression
computes), llvm.fma where one rounding is wanted, llvm.maxnum / minnum / rint / fabs, and
in-order reductions.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .vectors import F32, HALF, I32, F32Vec, I32Vec, call, vec


def _binary(kind: type, op: str):
    """An intrinsic a op b for two vectors of one type of class `kind`."""
    def typer(typingctx, a, b):
        if not isinstance(a, kind) or a != b:
            return None
        return a(a, a), lambda ctx, builder, sig, args: getattr(builder, op)(*args)
    return intrinsic(typer)


def _llvm_f32(name: str, binary: bool):
    """An intrinsic calling llvm.<name>.v<lanes>f32 on one or two F32Vec of one type."""
    def codegen_for(v):
        def codegen(context, builder, sig, args):
            return call(builder, f"llvm.{name}.v{v.lanes}f32", vec(v), list(args))
        return codegen

    def unary(typingctx, a):
        if not isinstance(a, F32Vec):
            return None
        return a(a), codegen_for(a)

    def pair(typingctx, a, b):
        if not isinstance(a, F32Vec) or a != b:
            return None
        return a(a, a), codegen_for(a)
    return intrinsic(pair if binary else unary)


vadd = _binary(F32Vec, "fadd")
vsub = _binary(F32Vec, "fsub")
vmul = _binary(F32Vec, "fmul")
vdiv = _binary(F32Vec, "fdiv")
vadd_i32 = _binary(I32Vec, "add")
vsub_i32 = _binary(I32Vec, "sub")
vmax = _llvm_f32("maxnum", True)
vmin = _llvm_f32("minnum", True)
vabs = _llvm_f32("fabs", False)


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c in one rounding (llvm.fma: vfmadd on avx2 / avx512, fmla on neon)."""
    if not isinstance(a, F32Vec) or not a == b == c:
        return None

    def codegen(context, builder, sig, args):
        return call(builder, f"llvm.fma.v{a.lanes}f32", vec(a), list(args))
    return a(a, a, a), codegen


def _lanewise(src: type, dst: type | None, lower):
    """An intrinsic f(v) for a vector of class src, giving a vector of class dst (None: v's
    own type) of the same width; lower(builder, value, v_type, result_type) emits the IR."""
    def typer(typingctx, v):
        if not isinstance(v, src):
            return None
        ret = v if dst is None else dst(v.lanes)
        return ret(v), lambda ctx, builder, sig, args: lower(builder, args[0], v, ret)
    return intrinsic(typer)


def _rint_to_i32(builder, x, v, ret):
    return builder.fptosi(call(builder, f"llvm.rint.v{v.lanes}f32", vec(v), [x]), vec(ret, I32))


def _pow2(builder, n, v, ret):
    iv = vec(v, I32)
    biased = builder.add(n, ir.Constant(iv, [127] * v.lanes))
    return builder.bitcast(builder.shl(biased, ir.Constant(iv, [23] * v.lanes)), vec(ret))


def _via_f16(builder, x, v, ret):
    return builder.fpext(builder.fptrunc(x, vec(v, HALF)), vec(v))


# int32 lanes -> float32 lanes (exact below 2**24)
vcvt_f32 = _lanewise(I32Vec, F32Vec, lambda builder, x, v, ret: builder.sitofp(x, vec(ret)))
# float32 lanes -> nearest int32 (ties to even)
vround_i32 = _lanewise(F32Vec, I32Vec, _rint_to_i32)
# 2**n for int32 lanes n in [-126, 127], built in the exponent field
vpow2_i32 = _lanewise(I32Vec, F32Vec, _pow2)
# each lane rounded to the nearest f16 value (ties to even), kept as float32
vround_f16 = _lanewise(F32Vec, None, _via_f16)


@intrinsic
def sround_f16(typingctx, x):
    """A scalar float32 rounded to the nearest f16 value (ties to even), as float32."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], HALF), F32)
    return types.float32(types.float32), codegen


@intrinsic
def sfma(typingctx, a, b, c):
    """a * b + c for float32 scalars in one rounding (llvm.fma.f32): the generic kernels'
    twin of vfma, so a generic lane rounds exactly as a vector lane does."""
    if not a == b == c == types.float32:
        return None

    def codegen(context, builder, sig, args):
        return call(builder, "llvm.fma.f32", F32, list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


def _reduce(src: type, name: str, scalar, element: ir.Type, start: float | None = None):
    """An intrinsic: the llvm.vector.reduce.<name> of a vector of class src, as a scalar;
    `start` (fadd) makes it the sequential sum from that value."""
    def typer(typingctx, v):
        if not isinstance(v, src):
            return None
        kind = "f32" if element is F32 else "i32"

        def codegen(context, builder, sig, args):
            first = [] if start is None else [ir.Constant(element, start)]
            return call(builder, f"llvm.vector.reduce.{name}.v{v.lanes}{kind}", element,
                        [*first, args[0]])
        return scalar(v), codegen
    return intrinsic(typer)


vhmax = _reduce(F32Vec, "fmax", types.float32, F32)  # largest lane
# sum of the lanes in lane order (sequential, so the result is reproducible)
vhsum = _reduce(F32Vec, "fadd", types.float32, F32, start=-0.0)
vhsum_i32 = _reduce(I32Vec, "add", types.int32, I32)
