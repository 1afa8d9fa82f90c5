"""GEGLU in vectors: kernels/gelu.geglu's f16-table GELU, 16 (AVX-512) or 8 (AVX2) lanes a step.

Per lane exactly what the scalar kernel (and ggml's CPU GELU) computes: the gate rounded to f16
by the hardware converter (vcvtps2ph, nearest even, as f16_bits), its bit pattern used as the
index of a gather from the 65536-entry table, the f32 result times the up projection; gates at
or beyond +-10 bypass the table (0, or gate * up).  Every f16 pattern indexes the table, so the
gather never leaves it whatever the gate holds; the bypass picks the result afterwards.
The scalar path costs a frexp and a branchy conversion per hidden unit and was the largest
stage of a gemma3 prefill (a third of it, 20x this kernel's time).  Rows are independent; long
batches split over threads.  gelu_mul picks the kernel by ISA at compile time, as dispatch.py
does for SwiGLU; other paths keep the scalar kernel.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..isa import IsaType
from ..simd import avx2, avx512
from .elementwise_avx512 import PARALLEL_ROWS
from .gelu import geglu

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_BYTE_PTR = ir.IntType(8).as_pointer()
_LIMIT = 10.0  # ggml: |x| >= 10 bypasses the table


def _splat(vec_ty: ir.VectorType, value: float) -> ir.Constant:
    return ir.Constant(vec_ty, [ir.Constant(vec_ty.element, value)] * vec_ty.count)


def _gather_16(builder, base, idx):
    mask = ir.Constant(ir.IntType(16), 0xFFFF)
    return _gather(builder, "llvm.x86.avx512.gather.dps.512", avx512.V16F,
                   [ir.Constant(avx512.V16F, None), base, idx, mask, ir.Constant(_I32, 4)])


def _gather_8(builder, base, idx):
    # AVX2's mask is a float vector whose lane sign bits select the lanes: all set
    ones = builder.bitcast(ir.Constant(avx2.V8I, [ir.Constant(_I32, -1)] * 8), avx2.V8F)
    return _gather(builder, "llvm.x86.avx2.gather.d.ps.256", avx2.V8F,
                   [ir.Constant(avx2.V8F, None), base, idx, ones, ir.Constant(ir.IntType(8), 4)])


def _gather(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _geglu_codegen(vec_f: ir.VectorType, gather):
    """IR of table-GELU(gate) * up for one vector of lanes (args: table, gate, up)."""
    lanes = vec_f.count

    def codegen(context, builder, sig, args):
        table, gate, up = args
        data = context.make_array(sig.args[0])(context, builder, table).data
        base = builder.bitcast(data, _BYTE_PTR)
        h = builder.fptrunc(gate, ir.VectorType(ir.HalfType(), lanes))
        idx = builder.zext(builder.bitcast(h, ir.VectorType(ir.IntType(16), lanes)),
                           ir.VectorType(_I32, lanes))
        looked = builder.fmul(gather(builder, base, idx), up)
        high = builder.fcmp_ordered(">=", gate, _splat(vec_f, _LIMIT))
        low = builder.fcmp_ordered("<=", gate, _splat(vec_f, -_LIMIT))
        res = builder.select(high, builder.fmul(gate, up), looked)
        return builder.select(low, ir.Constant(vec_f, None), res)
    return codegen


@intrinsic
def vgeglu16(typingctx, table, gate, up):
    """gelu(gate) * up, 16 lanes (table: gelu.gelu_f16_table())."""
    return (avx512.f32x16(table, avx512.f32x16, avx512.f32x16),
            _geglu_codegen(avx512.V16F, _gather_16))


@intrinsic
def vgeglu8(typingctx, table, gate, up):
    """gelu(gate) * up, 8 lanes (table: gelu.gelu_f16_table())."""
    return (avx2.f32x8(table, avx2.f32x8, avx2.f32x8),
            _geglu_codegen(avx2.V8F, _gather_8))


@njit(nogil=True)
def _row16(gu, n_ff, table, out):
    for c in range(0, n_ff, 16):
        avx512.vstore_f32(out, c, vgeglu16(table, avx512.vload_f32(gu, c),
                                           avx512.vload_f32(gu, n_ff + c)))


@njit(nogil=True)
def _row8(gu, n_ff, table, out):
    for c in range(0, n_ff, 8):
        avx2.vstore_f32(out, c, vgeglu8(table, avx2.vload_f32(gu, c),
                                        avx2.vload_f32(gu, n_ff + c)))


@njit(cache=True, nogil=True, parallel=True)
def geglu_avx512(gate_up, n_ff, table, out):
    """gate_up (n_tokens, 2 n_ff) = [gate | up] -> out (n_tokens, n_ff) = gelu(gate) * up,
    as gelu.geglu; n_ff % 16 == 0."""
    n = gate_up.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _row16(gate_up[i], n_ff, table, out[i])
    else:
        for i in prange(n):
            _row16(gate_up[i], n_ff, table, out[i])


@njit(cache=True, nogil=True, parallel=True)
def geglu_avx2(gate_up, n_ff, table, out):
    """As geglu_avx512 in 8 lanes; n_ff % 8 == 0."""
    n = gate_up.shape[0]
    if n < PARALLEL_ROWS:
        for i in range(n):
            _row8(gate_up[i], n_ff, table, out[i])
    else:
        for i in prange(n):
            _row8(gate_up[i], n_ff, table, out[i])



def gelu_mul(isa, gate_up, n_ff, table, out):
    """out (n_tokens, n_ff) = gelu(gate) * up of gate_up = [gate | up], through the f16 table."""


@overload(gelu_mul, jit_options={"nogil": True})
def _gelu_mul(isa, gate_up, n_ff, table, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "avx512":
        def fast(isa, gate_up, n_ff, table, out):
            geglu_avx512(gate_up, n_ff, table, out)
        return fast
    if isa.isa == "avx2":
        def avx2_path(isa, gate_up, n_ff, table, out):
            geglu_avx2(gate_up, n_ff, table, out)
        return avx2_path

    def scalar(isa, gate_up, n_ff, table, out):
        geglu(gate_up, n_ff, table, out)
    return scalar
