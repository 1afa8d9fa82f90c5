"""The byte dot products of the matmul kernels, on I32Vec views of 4 x lanes bytes: the one
place where the instruction set shows.  Each takes the kernel's IsaType first and picks its
instruction from it at compile time:

    avx512          vpdpbusd zmm
    avx2 + vnni     vpdpbusd ymm (AVX-VNNI, or AVX-512 VNNI + VL)
    avx2            the pair vpmaddubsw + vpmaddwd
    neon            SDOT on each 128-bit half (simd/neon.py)

vpdpbusd multiplies unsigned by signed bytes.  The AVX2 pair sums two u8 x s8 products into a
saturating int16 first, so it is exact only while those sums fit: 4- and 5-bit codes (<= 31)
against int8 activations always do; 8-bit weights go through vdot_q8, which uses the sign
trick instead (|w| against sign(w) * x, both fit).  SDOT is signed on both sides, so neon's
vdot_q8 flips the stored w + 128 back to w.  q8_offset says what the kernel then subtracts.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from . import neon
from .vectors import I8, I32, I32Vec, call, vec, width

I16 = ir.IntType(16)


def _nibble_mask(v: I32Vec) -> ir.Constant:
    return ir.Constant(vec(v, I32), [0x0F0F0F0F] * v.lanes)


@intrinsic
def vnib_lo(typingctx, v):
    """Low nibble of each byte (0..15, as unsigned bytes)."""
    if not isinstance(v, I32Vec):
        return None
    return v(v), lambda ctx, builder, sig, args: builder.and_(args[0], _nibble_mask(v))


@intrinsic
def vnib_hi(typingctx, v):
    """High nibble of each byte, moved down (0..15)."""
    if not isinstance(v, I32Vec):
        return None

    def codegen(context, builder, sig, args):
        shifted = builder.lshr(args[0], ir.Constant(vec(v, I32), [4] * v.lanes))
        return builder.and_(shifted, _nibble_mask(v))
    return v(v), codegen


@intrinsic
def vfifth(typingctx, nib, plane, k):
    """5-bit codes of group k (0..7) of a 5-bit tile (quants/tiles.py): nib (the group's
    nibbles, 0..15 per byte) with bit k of each plane byte added as bit 4.  Shifting 32-bit
    lanes moves bit k of every byte to bit 4 of the same byte (shifts of at most 4, and the
    mask drops what crossed from a neighbour); with k a constant after unrolling, that is one
    shift, an and and an or."""
    if not isinstance(nib, I32Vec) or nib != plane:
        return None

    def codegen(context, builder, sig, args):
        v, p, kk = args[0], args[1], context.cast(builder, args[2], sig.args[2], types.int32)
        zeros = ir.Constant(vec(nib, I32), None)

        def splat(x):  # x in every lane
            one = builder.insert_element(zeros, x, ir.Constant(I32, 0))
            return builder.shuffle_vector(one, zeros, zeros)

        four, none = ir.Constant(I32, 4), ir.Constant(I32, 0)
        low = builder.icmp_signed("<", kk, four)  # k < 4: bit k moves up, else down
        left = builder.select(low, builder.sub(four, kk), none)
        right = builder.select(low, none, builder.sub(kk, four))
        moved = builder.lshr(builder.shl(p, splat(left)), splat(right))
        return builder.or_(v, builder.and_(moved, ir.Constant(vec(nib, I32),
                                                              [0x10101010] * nib.lanes)))
    return nib(nib, plane, k), codegen


def _madd_pair(builder, u, s):
    """Per lane (8 lanes), sum over its 4 bytes of u8(u) * s8(s), via vpmaddubsw (pairs into
    saturating int16) and vpmaddwd against ones (pairs of int16 into int32)."""
    v16s = ir.VectorType(I16, 16)
    v32b = ir.VectorType(I8, 32)
    p16 = call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16s,
               [builder.bitcast(u, v32b), builder.bitcast(s, v32b)])
    return call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(I32, 8),
                [p16, ir.Constant(v16s, [1] * 16)])


def _flavour(isa, acc) -> str:
    """'vnni' (vpdpbusd at acc's width), 'pair' (AVX2 without VNNI) or 'neon' (SDOT)."""
    n = width(isa)
    if not isinstance(acc, I32Vec) or acc.lanes != n:
        raise TypingError(f"dot product accumulator {acc} does not match {isa}")
    if isa.isa == "neon":
        return "neon"
    if isa.vnni:
        return "vnni"
    return "pair"


def _byte_dot(on_neon, pair):
    """An intrinsic (isa, acc, u, s) -> acc + per-lane dot products of u's and s's bytes:
    vpdpbusd on VNNI paths, else on_neon(builder, acc, u, s) or acc + pair(builder, u, s)."""
    def typer(typingctx, isa, acc, u, s):
        how = _flavour(isa, acc)

        def codegen(context, builder, sig, args):
            _, a, uu, ss = args
            if how == "neon":
                return on_neon(builder, a, uu, ss)
            if how == "vnni":
                return call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * acc.lanes}", a.type,
                            [a, uu, ss])
            return builder.add(a, pair(builder, uu, ss))
        return acc(isa, acc, acc, acc), codegen
    return intrinsic(typer)


def _madd_sign(builder, u, s):
    """The pair for 8-bit weights w + 128 (u): |w| against sign(w) * s, so every int16 pair
    sum stays below 2 * 128 * 127 < 2**15 (exact), giving sum w * s with no offset."""
    v32b = ir.VectorType(I8, 32)
    w = builder.xor(builder.bitcast(u, v32b), ir.Constant(v32b, [0x80] * 32))
    aw = call(builder, "llvm.abs.v32i8", v32b, [w, ir.Constant(ir.IntType(1), 0)])
    sx = call(builder, "llvm.x86.avx2.psign.b", v32b, [builder.bitcast(s, v32b), w])
    return _madd_pair(builder, aw, sx)


# acc[l] += sum over k<4 of u8(u bytes 4l+k) * s8(s bytes 4l+k), for 4- or 5-bit codes u (exact
# on every flavour: each pair sum of the AVX2 fallback fits int16)
vdpbusd = _byte_dot(neon.sdot_u4, _madd_pair)
# 8-bit weights stored as w + 128 (unsigned bytes u) against int8 activations s.  VNNI:
# acc += sum u * s (offset included: the kernel subtracts 128 * sum s per block); the AVX2
# pair and neon (a flip, then SDOT): acc += sum w * s, no offset
vdot_q8 = _byte_dot(neon.sdot_q8, _madd_sign)


@intrinsic
def q8_offset(typingctx, isa):
    """The code offset the kernel subtracts for 8-bit weights after vdot_q8: 128 where it is
    vpdpbusd, 0 for the AVX2 pair and SDOT."""
    width(isa)
    off = 128 if isa.vnni else 0
    return types.int64(isa), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(64), off)


# ---- one block's 4- and 5-bit products as partial sums in the narrowest exact type ----------
#
# The AVX2 pair spends a vpmaddwd (and an add) on every group only to widen int16 pair sums to
# int32.  For 4-bit codes that is not needed per group: a vpmaddubsw pair sum is at most
# 2 * 15 * 128 = 3840, so the sums of up to eight groups (one block of 32 columns: 30720) fit
# int16 exactly, and one vpmaddwd per chain and block widens them.  Same integers, so the
# result is bit for bit that of vdpbusd; about 1.1-1.3x faster kernels on the pair path.
# 5-bit codes: a pair sum is at most 2 * 31 * 128 = 7936, so a chain may sum four groups
# (31744 < 2**15) before vwiden.  On the other flavours there is nothing to save: the partial
# sums are vdpbusd's int32 lanes.


@intrinsic
def vdot4_part(typingctx, isa, acc, u, s):
    """acc + the byte dot products of 4- or 5-bit codes u against int8 s, as partial sums:
    int16 pairs (viewed as acc's type) on the AVX2 pair, int32 lanes elsewhere.  On the pair
    a chain may sum at most eight groups of 4-bit codes, four of 5-bit ones, before vwiden."""
    how = _flavour(isa, acc)

    def codegen(context, builder, sig, args):
        _, a, uu, ss = args
        if how == "neon":
            return neon.sdot_u4(builder, a, uu, ss)
        if how == "vnni":
            return call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * acc.lanes}", a.type,
                        [a, uu, ss])
        v16s = ir.VectorType(I16, 16)
        v32b = ir.VectorType(I8, 32)
        p16 = call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16s,
                   [builder.bitcast(uu, v32b), builder.bitcast(ss, v32b)])
        total = builder.add(builder.bitcast(a, v16s), p16)  # exact: see the bound above
        return builder.bitcast(total, a.type)
    return acc(isa, acc, acc, acc), codegen


@intrinsic
def vwiden(typingctx, isa, part):
    """vdot4_part's partial sums -> int32 lanes (vpmaddwd against ones on the AVX2 pair)."""
    how = _flavour(isa, part)

    def codegen(context, builder, sig, args):
        p = args[1]
        if how != "pair":
            return p
        v16s = ir.VectorType(I16, 16)
        return call(builder, "llvm.x86.avx2.pmadd.wd", p.type,
                    [builder.bitcast(p, v16s), ir.Constant(v16s, [1] * 16)])
    return part(isa, part), codegen
