"""out = x @ W.T over 16-row weight tiles (quants/tiles.py), one source for every vector path.

A vector of the IsaType's width holds one value per output row: on avx512 (16 lanes) a tile is
one vector; on avx2 and neon (8 lanes) it is two parts of 8 rows (bytes 0..31 and 32..63 of
every 64-byte group hold rows 0..7 and 8..15; scales d[t, b, 0:8] and d[t, b, 8:16]), so one
layout serves every path.  Per part and block of 32 columns, byte dot products (simd/dot.py)
sum weight codes times int8 activation codes into int32 lanes; then, per lane, exactly the
scalar formula of kernels/matmul.py:
    acc = fma(m_w, s_x, fma(d_w, d_x * float(isum - zero * xsum), acc))
(the subtraction done as float(isum) - float(zero * xsum), the same bits: _accumulate) with the
same operation order, the same two fused multiply-adds and no fast-math, so every output
equals the generic path's bit for bit, and a row's result does not depend on how many rows share
the call.

The weight kind (a TileKind, tile_kind.py) is part of the Numba type, so each kind compiles
its own kernel with one loop, and a model compiles only the kinds it has: 4-bit codes (KIND_Q4),
5-bit codes (KIND_Q5: a group's nibbles joined with its fifth bits, simd/dot.py vfifth) and
128-offset bytes (KIND_Q8).  4- and 5-bit codes meet the activations in the same unsigned byte
dot products; the kernel subtracts zero * xsum per block, which makes the integer sums those of
the generic path's (code - zero) * x.

Batched steps take activation rows four at a time: each weight group is loaded and unpacked
once and used by four rows (_isum4, whose chains per row depend on the width and kind).  One
prange over tile parts; a tile's weights (a few KB) stay in L1 while every group of rows
passes over them, and the first pass prefetches the next tile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import overload

from ..quants.packed import KIND_Q5, KIND_Q8
from ..quants.tiles import TILE_ROWS
from ..simd.dot import q8_offset, vdot4_part, vdot_q8, vfifth, vnib_hi, vnib_lo, vwiden
from ..simd.prefetch import prefetch
from ..simd.vectors import (
    lanes,
    vbcast4,
    vlane,
    vload_bytes,
    vload_f16,
    vsplat_f32,
    vstore_bytes,
    vstore_f32,
    vzero_f32,
    vzero_i32,
    width,
)
from ..simd.vmath import vadd_i32, vcvt_f32, vfma, vmul, vsub
from ..tile_kind import KIND_CODES5, TileKindType, decoded_kind, has_mins, kind_of

# a part's 5-bit codes are unpacked once, to bytes, when at least this many activation rows
# pass over them (prefill chunks, batched and speculative steps) instead of once per 4 rows
DECODE_ROWS = 16


@njit(nogil=True)
def _accumulate(isa, kind, acc, isum, dw, mw, xd, xz, xs):
    """acc + dw * (xd * (float(isum) - xz)) + mw * xs, lane by lane, in two fused
    multiply-adds (kernels/matmul.py's _block; 6-10% faster on the AVX2 pair than separate
    multiplies and adds).  xz is float(zero * xi), the block's code offset, from _offsets:
    float(isum) - xz is the generic path's float(isum - zero * xi) bit for bit (both are
    integers below 2**24 in magnitude, so each converts exactly and so does their difference)
    and costs a broadcast load and a subtraction where the integer form cost a scalar
    multiply, a move to a vector register and a shuffle per row and block.  Both tests are
    constants of the kind's type: a kind with mins has no code offset (the subtraction and
    its broadcast leave the loop), one without has no min term (the generic path's fma with
    m = 0 leaves acc as it is)."""
    f = vcvt_f32(isum)
    if not (has_mins(kind) and kind_of(kind) != KIND_Q8):
        f = vsub(f, vsplat_f32(isa, xz))  # zero is 0 with mins (weights.stack_tiles checks it)
    acc = vfma(dw, vmul(vsplat_f32(isa, xd), f), acc)
    if has_mins(kind):
        acc = vfma(mw, vsplat_f32(isa, xs), acc)
    return acc


@njit(nogil=True)
def _group(isa, kind, w, wo, k):
    """Weight codes of group k (elements 4k..4k+3 of the part's rows; k < 8) of one block;
    kind_of(kind) is a constant, so only one branch is left."""
    if kind_of(kind) == KIND_Q8:
        return vload_bytes(isa, w, wo + 64 * k)
    if kind_of(kind) == KIND_CODES5:  # decoded by _decode_part: one part's groups in a row
        return vload_bytes(isa, w, wo + 4 * lanes(isa) * k)
    g = vload_bytes(isa, w, wo + 64 * (k % 4))
    nib = vnib_lo(g) if k < 4 else vnib_hi(g)
    if kind_of(kind) == KIND_Q5:  # the fifth bits: the plane after the four nibble groups
        return vfifth(nib, vload_bytes(isa, w, wo + 256), k)
    return nib


@njit(nogil=True)
def _part_dot(isa, kind, acc, g, x):
    """acc + the byte dot products of weight codes g and activation codes x, where 4- and
    5-bit products may stay partial sums of one block (simd/dot.py: at most eight groups of
    4-bit codes per chain, four of 5-bit ones, before _widen)."""
    if kind_of(kind) == KIND_Q8:
        return vdot_q8(isa, acc, g, x)
    return vdot4_part(isa, acc, g, x)


@njit(nogil=True)
def _widen(isa, kind, part):
    return part if kind_of(kind) == KIND_Q8 else vwiden(isa, part)


@njit(nogil=True)
def _isum1(isa, kind, w, wo, xq, xo):
    """One block, one activation row: int32 sums of weight codes x activation codes, in two
    chains (of four groups each, within vdot4_part's bound for 5-bit codes) for latency."""
    lo = vzero_i32(isa)
    hi = vzero_i32(isa)
    for k in range(4):
        lo = _part_dot(isa, kind, lo, _group(isa, kind, w, wo, k), vbcast4(isa, xq, xo + 4 * k))
        hi = _part_dot(isa, kind, hi, _group(isa, kind, w, wo, k + 4),
                       vbcast4(isa, xq, xo + 16 + 4 * k))
    return vadd_i32(_widen(isa, kind, lo), _widen(isa, kind, hi))


def _isum4(isa, kind, w, wo, xq, xo, rs):
    """One block, four activation rows (rs elements apart): four vectors of int32 sums."""


def _isum4_two_chains(isa, kind, w, wo, xq, xo, rs):
    """Each row sums in two chains, even and odd groups, that meet at the end: eight
    independent vpdpbusd chains hide the instruction's latency where four left the 16-lane
    kernel latency-bound (about 1.4x faster there; integer sums, so the result is the same in
    any order).  Splitting by nibble instead (one load feeding both chains) measured slower.
    Four groups per chain also keep 5-bit partial sums on the AVX2 pair within int16."""
    a0 = vzero_i32(isa)
    a1 = vzero_i32(isa)
    a2 = vzero_i32(isa)
    a3 = vzero_i32(isa)
    b0 = vzero_i32(isa)
    b1 = vzero_i32(isa)
    b2 = vzero_i32(isa)
    b3 = vzero_i32(isa)
    for kk in range(4):
        k = 2 * kk
        o = xo + 4 * k
        g = _group(isa, kind, w, wo, k)
        a0 = _part_dot(isa, kind, a0, g, vbcast4(isa, xq, o))
        a1 = _part_dot(isa, kind, a1, g, vbcast4(isa, xq, o + rs))
        a2 = _part_dot(isa, kind, a2, g, vbcast4(isa, xq, o + 2 * rs))
        a3 = _part_dot(isa, kind, a3, g, vbcast4(isa, xq, o + 3 * rs))
        g = _group(isa, kind, w, wo, k + 1)
        o += 4
        b0 = _part_dot(isa, kind, b0, g, vbcast4(isa, xq, o))
        b1 = _part_dot(isa, kind, b1, g, vbcast4(isa, xq, o + rs))
        b2 = _part_dot(isa, kind, b2, g, vbcast4(isa, xq, o + 2 * rs))
        b3 = _part_dot(isa, kind, b3, g, vbcast4(isa, xq, o + 3 * rs))
    return (_sum2(isa, kind, a0, b0), _sum2(isa, kind, a1, b1), _sum2(isa, kind, a2, b2),
            _sum2(isa, kind, a3, b3))


@njit(nogil=True)
def _sum2(isa, kind, a, b):
    """Two chains' partial sums -> int32 lanes."""
    return vadd_i32(_widen(isa, kind, a), _widen(isa, kind, b))


def _isum4_one_chain(isa, kind, w, wo, xq, xo, rs):
    """One chain per row: 4 int + 4 float accumulators fit the 16 ymm registers (a second
    chain per row, which helps the 16-lane kernel, measured no faster at 8 lanes).  Not for
    5-bit codes on the AVX2 pair: eight groups would overflow its int16 partial sums."""
    s0 = vzero_i32(isa)
    s1 = vzero_i32(isa)
    s2 = vzero_i32(isa)
    s3 = vzero_i32(isa)
    for k in range(8):
        g = _group(isa, kind, w, wo, k)
        o = xo + 4 * k
        s0 = _part_dot(isa, kind, s0, g, vbcast4(isa, xq, o))
        s1 = _part_dot(isa, kind, s1, g, vbcast4(isa, xq, o + rs))
        s2 = _part_dot(isa, kind, s2, g, vbcast4(isa, xq, o + 2 * rs))
        s3 = _part_dot(isa, kind, s3, g, vbcast4(isa, xq, o + 3 * rs))
    return (_widen(isa, kind, s0), _widen(isa, kind, s1), _widen(isa, kind, s2),
            _widen(isa, kind, s3))


@overload(_isum4, jit_options={"nogil": True})
def _isum4_for_width(isa, kind, w, wo, xq, xo, rs):
    # chosen while typing: only the width's own variant is compiled; 5-bit codes on the
    # AVX2 pair (int16 partial sums, four groups at most) take two chains at 8 lanes too
    pair = isa.isa == "avx2" and not isa.vnni
    five = isinstance(kind, TileKindType) and kind.kind in (KIND_Q5, KIND_CODES5)
    if width(isa) == 16 or (pair and five):
        return _isum4_two_chains
    return _isum4_one_chain


@njit(nogil=True)
def _store(isa, out, i, r0, rows, acc):
    if r0 + lanes(isa) <= rows:
        vstore_f32(out[i], r0, acc)
    else:
        for lane in range(rows - r0):
            out[i, r0 + lane] = vlane(acc, lane)


@njit(nogil=True, inline="always")
def _prefetch_block(kind, w, d, m, nxt, b):
    """Ask for block b of tile nxt (weights, scales, mins; every part's, as the parts share
    cache lines) ahead of its use."""
    nb, tb = w.shape[1], w.shape[2]
    for c in range(tb // 64):
        prefetch(w, (nxt * nb + b) * tb + 64 * c)
    prefetch(d, (nxt * nb + b) * TILE_ROWS)
    if has_mins(kind):
        prefetch(m, (nxt * nb + b) * TILE_ROWS)


@njit(nogil=True, inline="always")
def _block(isa, kind, w, d, m, t, h, wt, wh, b, pf, nxt):
    """Block b of part h of tile t: its scales and mins (f32 lanes) and the offset of its
    weight bytes, which are part wh of tile wt of w (t, h; or 0, 0 in a part's decoded
    codes); with pf, first a prefetch of block b of tile nxt."""
    if pf:
        _prefetch_block(kind, w, d, m, nxt, b)
    nb, tb = w.shape[1], w.shape[2]
    n = lanes(isa)
    mo = (t * nb + b) * TILE_ROWS + h * n
    dw = vload_f16(isa, d, mo)
    mw = vload_f16(isa, m, mo) if has_mins(kind) else dw
    return dw, mw, (wt * nb + b) * tb + wh * 4 * n


@njit(nogil=True, inline="always")
def _rows4(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, wt, wh, i, pf, nxt):
    """Rows i..i+3 of out, part h of tile t (its weights: part wh of tile wt of w).  pf
    (prefetch tile nxt alongside): a constant at each call site."""
    rs = xq.strides[0]  # int8: bytes == elements
    a0 = vzero_f32(isa)
    a1 = vzero_f32(isa)
    a2 = vzero_f32(isa)
    a3 = vzero_f32(isa)
    for b in range(w.shape[1]):
        dw, mw, wo = _block(isa, kind, w, d, m, t, h, wt, wh, b, pf, nxt)
        s0, s1, s2, s3 = _isum4(isa, kind, w, wo, xq, i * rs + 32 * b, rs)
        a0 = _accumulate(isa, kind, a0, s0, dw, mw, xd[i, b], xz[i, b], xs[i, b])
        a1 = _accumulate(isa, kind, a1, s1, dw, mw, xd[i + 1, b], xz[i + 1, b],
                         xs[i + 1, b])
        a2 = _accumulate(isa, kind, a2, s2, dw, mw, xd[i + 2, b], xz[i + 2, b],
                         xs[i + 2, b])
        a3 = _accumulate(isa, kind, a3, s3, dw, mw, xd[i + 3, b], xz[i + 3, b],
                         xs[i + 3, b])
    r0 = t * TILE_ROWS + h * lanes(isa)
    rows = out.shape[1]
    _store(isa, out, i, r0, rows, a0)
    _store(isa, out, i + 1, r0, rows, a1)
    _store(isa, out, i + 2, r0, rows, a2)
    _store(isa, out, i + 3, r0, rows, a3)


@njit(nogil=True, inline="always")
def _row1(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, wt, wh, i, pf, nxt):
    """Row i of out, part h of tile t; the rest as in _rows4."""
    rs = xq.strides[0]
    acc = vzero_f32(isa)
    for b in range(w.shape[1]):
        dw, mw, wo = _block(isa, kind, w, d, m, t, h, wt, wh, b, pf, nxt)
        s = _isum1(isa, kind, w, wo, xq, i * rs + 32 * b)
        acc = _accumulate(isa, kind, acc, s, dw, mw, xd[i, b], xz[i, b], xs[i, b])
    _store(isa, out, i, t * TILE_ROWS + h * lanes(isa), out.shape[1], acc)


@njit(nogil=True, inline="always")
def _decode_part(isa, kind, w, d, m, t, h, nxt, codes):
    """Part h of tile t's codes as bytes, block b's group k at codes[0, b, 4 n k:], read as
    KIND_CODES5; prefetching tile nxt meanwhile, as a first pass of rows would."""
    nb, tb = w.shape[1], w.shape[2]
    n = lanes(isa)
    for b in range(nb):
        _prefetch_block(kind, w, d, m, nxt, b)
        wo = (t * nb + b) * tb + h * 4 * n
        for k in range(8):
            vstore_bytes(codes, b * 32 * n + 4 * n * k, _group(isa, kind, w, wo, k))


def _rows_decoded(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, nxt):
    """Every row of out against part h of tile t, the part's 5-bit codes decoded once."""


@overload(_rows_decoded, jit_options={"nogil": True})
def _rows_decoded_for_kind(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, nxt):
    # typed per kind: other kinds never reach it (_part's test is a constant, but Numba types
    # and inlines both branches before LLVM drops the dead one), so they get an empty body
    # instead of a second copy of the row loops: SmolLM2's two kinds compiled in 9.1 s of CPU
    # instead of 15.8, a cold start 30 s instead of 38 (qwen2.5-coder-0.5b: 56 instead of 66)
    if kind.kind != KIND_Q5:
        def none(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, nxt):
            pass
        return none

    def decoded(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, nxt):
        n_tokens = out.shape[0]
        # the fifth-bit unpacking (~7 instructions a group on the AVX2 pair) once per part
        # rather than once per 4 rows: the rows then read plain bytes; the same integers
        codes = np.empty((1, w.shape[1], 32 * lanes(isa)), np.uint8)
        _decode_part(isa, kind, w, d, m, t, h, nxt, codes)
        ck = decoded_kind(kind)
        i = 0
        while i + 4 <= n_tokens:
            _rows4(isa, ck, codes, d, m, xq, xd, xz, xs, out, t, h, 0, 0, i, False, nxt)
            i += 4
        while i < n_tokens:
            _row1(isa, ck, codes, d, m, xq, xd, xz, xs, out, t, h, 0, 0, i, False, nxt)
            i += 1
    return decoded


@njit(nogil=True, inline="always")
def _part(isa, kind, w, d, m, xq, xd, xz, xs, out, u):
    """Every row of out against part u of the tiles (tile u // parts, part u % parts), four
    rows per pass; the first pass also prefetches the next tile (a thread's parts are
    consecutive under prange's static split)."""
    n_tokens, rows = out.shape
    parts = TILE_ROWS // lanes(isa)
    t = np.int64(u) // parts
    h = np.int64(u) % parts
    if t * TILE_ROWS + h * lanes(isa) >= rows:
        return  # the padding half of a last tile
    nxt = min(t + 1, w.shape[0] - 1)
    if kind_of(kind) == KIND_Q5 and n_tokens >= DECODE_ROWS:
        _rows_decoded(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, nxt)
        return
    i = 0
    if n_tokens >= 4:
        _rows4(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, t, h, 0, True, nxt)
        i = 4
    elif n_tokens > 0:
        _row1(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, t, h, 0, True, nxt)
        i = 1
    while i + 4 <= n_tokens:
        _rows4(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, t, h, i, False, nxt)
        i += 4
    while i < n_tokens:
        _row1(isa, kind, w, d, m, xq, xd, xz, xs, out, t, h, t, h, i, False, nxt)
        i += 1


@njit(nogil=True)
def _offsets(zo, xi):
    """float(zo * xi) per row and block, once a call rather than once per part."""
    xz = np.empty(xi.shape, np.float32)
    for i in range(xi.shape[0]):
        for b in range(xi.shape[1]):
            xz[i, b] = np.float32(zo * xi[i, b])
    return xz


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles(isa, kind, zero, w, d, m, xq, xd, xi, xs, out):
    """w (tiles, nb, 256 | 320 | 512) u8; d, m (tiles, nb, 16) f16 bits (m may be empty);
    xq (n_tokens, >= cols) i8 rows; xd, xs (n_tokens, nb) f32; xi (n_tokens, nb) i32
    -> out (n_tokens, rows) f32.  kind: a TileKind (KIND_Q4, KIND_Q5 or KIND_Q8 tiles);
    isa (a vector IsaType) sets the width and picks the byte dot product.  m is empty unless
    the kind has mins, and then zero is 0 (checked: the formula relies on both).

    One loop, compiled per kind, so the code width is a constant inside it and the unpacking
    branches leave the inner loop (about 20% faster here than testing it there); whether the
    kind has mins is part of its type too, so the per-block formula has no test of it and, with
    mins, no code offset either (+13-17% on 1 thread for Q4_1 on the AVX2 pair, no compile cost:
    a model compiles the variant it has); prefetching the next tile made batched steps another
    10-35% faster."""
    n_parts = w.shape[0] * (TILE_ROWS // lanes(isa))
    # 8-bit weights: vdot_q8 may leave no offset to subtract
    zo = q8_offset(isa) if kind_of(kind) == KIND_Q8 else zero
    mins = has_mins(kind)
    if mins != (m.size > 0) or (mins and kind_of(kind) != KIND_Q8 and zero != 0):
        raise ValueError("matmul_tiles: the kind's mins do not match m and zero")
    xz = _offsets(zo, xi)
    for u in prange(n_parts):
        _part(isa, kind, w, d, m, xq, xd, xz, xs, out, u)

