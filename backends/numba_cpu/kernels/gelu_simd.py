"""GEGLU in vectors: kernels/gelu.geglu's f16-table GELU, a vector of the IsaType's width
(16 lanes on avx512, 8 on avx2) a step.

Per lane exactly what the scalar kernel (and ggml's CPU GELU) computes: the gate rounded to f16
by the hardware converter (vcvtps2ph, nearest even, as f16_bits), its bit pattern used as the
index of a gather from the 65536-entry table, the f32 result times the up projection; gates at
or beyond +-10 bypass the table (0, or gate * up).  Every f16 pattern indexes the table, so the
gather never leaves it whatever the gate holds; the bypass picks the result afterwards.
The scalar path costs a frexp and a branchy conversion per hidden unit and was the largest
stage of a gemma3 prefill (a third of it, 20x this kernel's time).  Rows are independent; long
batches split over threads.  gelu_mul picks the kernel by ISA at compile time, as dispatch.py
does for SwiGLU; neon (no gather instruction) and generic keep the scalar kernel.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..isa import IsaType
from ..simd.vectors import F32Vec, lanes, vload_f32, vstore_f32, width
from .elementwise import PARALLEL_ROWS
from .gelu import geglu

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_BYTE_PTR = ir.IntType(8).as_pointer()
_LIMIT = 10.0  # ggml: |x| >= 10 bypasses the table
GATHER_ISAS = ("avx512", "avx2")  # x86 has a gather instruction; neon would scalarize it


def _splat(vec_ty: ir.VectorType, value: float) -> ir.Constant:
    return ir.Constant(vec_ty, [ir.Constant(vec_ty.element, value)] * vec_ty.count)


def _gather(builder, base, idx, lanes: int):
    """The f32 table entries at byte offsets 4 * idx from base, all lanes."""
    vf = ir.VectorType(_F32, lanes)
    if lanes == 16:
        name = "llvm.x86.avx512.gather.dps.512"
        args = [ir.Constant(vf, None), base, idx, ir.Constant(ir.IntType(16), 0xFFFF),
                ir.Constant(_I32, 4)]
    else:
        # AVX2's mask is a float vector whose lane sign bits select the lanes: all set
        ones = builder.bitcast(ir.Constant(ir.VectorType(_I32, 8), [ir.Constant(_I32, -1)] * 8),
                               vf)
        name = "llvm.x86.avx2.gather.d.ps.256"
        args = [ir.Constant(vf, None), base, idx, ones, ir.Constant(ir.IntType(8), 4)]
    fnty = ir.FunctionType(vf, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


@intrinsic
def vgeglu(typingctx, isa, table, gate, up):
    """gelu(gate) * up, lane by lane (table: gelu.gelu_f16_table())."""
    n = width(isa)
    if isa.isa not in GATHER_ISAS or not isinstance(gate, F32Vec) or gate != up:
        return None
    vec_f = ir.VectorType(_F32, n)

    def codegen(context, builder, sig, args):
        _, table, gate, up = args
        data = context.make_array(sig.args[1])(context, builder, table).data
        base = builder.bitcast(data, _BYTE_PTR)
        h = builder.fptrunc(gate, ir.VectorType(ir.HalfType(), n))
        idx = builder.zext(builder.bitcast(h, ir.VectorType(ir.IntType(16), n)),
                           ir.VectorType(_I32, n))
        looked = builder.fmul(_gather(builder, base, idx, n), up)
        high = builder.fcmp_ordered(">=", gate, _splat(vec_f, _LIMIT))
        low = builder.fcmp_ordered("<=", gate, _splat(vec_f, -_LIMIT))
        res = builder.select(high, builder.fmul(gate, up), looked)
        return builder.select(low, ir.Constant(vec_f, None), res)
    return gate(isa, table, gate, gate), codegen


@njit(nogil=True)
def _row(isa, gu, n_ff, table, out):
    for c in range(0, n_ff, lanes(isa)):
        vstore_f32(out, c, vgeglu(isa, table, vload_f32(isa, gu, c),
                                  vload_f32(isa, gu, n_ff + c)))


@njit(cache=True, nogil=True, parallel=True)
def geglu_simd(isa, gate_up, n_ff, table, out):
    """gate_up (n_tokens, 2 n_ff) = [gate | up] -> out (n_tokens, n_ff) = gelu(gate) * up,
    as gelu.geglu; isa avx512 or avx2, n_ff a multiple of its lane count."""
    n = gate_up.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _row(isa, gate_up[i], n_ff, table, out[i])
    else:
        for i in prange(n):
            _row(isa, gate_up[i], n_ff, table, out[i])


def gelu_mul(isa, gate_up, n_ff, table, out):
    """out (n_tokens, n_ff) = gelu(gate) * up of gate_up = [gate | up], through the f16 table."""


@overload(gelu_mul, jit_options={"nogil": True})
def _gelu_mul(isa, gate_up, n_ff, table, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa in GATHER_ISAS:
        def vector(isa, gate_up, n_ff, table, out):
            geglu_simd(isa, gate_up, n_ff, table, out)
        return vector

    def scalar(isa, gate_up, n_ff, table, out):
        geglu(gate_up, n_ff, table, out)
    return scalar
