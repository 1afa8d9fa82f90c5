"""Re-lay one GGUF tensor's raw bytes into the Triton backend's weight layout (numpy only).

Every linear weight ends up in one of three kinds, all row-major per output row (a tile of
rows reads contiguous bytes), and every quantized kind dequantizes the same way inside a tile:

    value = scale[row, k // group] * code[row, k] + bias[row, k // group]     (f32)

* KIND_FLOAT: ``w`` is the (rows, cols) float matrix; F32 / F16 as they are, BF16 as its raw
  uint16 bit patterns (uploaded as torch.bfloat16, widened to f32 in the kernel).  Types with
  no affine form (Q2_K, Q3_K, IQ4_NL, IQ4_XS) are dequantized here and stored as F16
  (``exact=False``).
* KIND_NIBBLE: ``w`` (rows, cols // 2) uint8, byte j = element 2j (low nibble) | element 2j+1
  (high nibble); 5-bit codes add ``hi`` (rows, cols // 8), bit b of byte j = bit 4 of element
  8j+b; Q6_K's 6-bit codes add ``hi`` (rows, cols // 4), bits 2b..2b+1 of byte j = bits 4..5 of
  element 4j+b.  ggml's in-block orders (element i with i+16 in one byte, Q6_K's quarter-block
  interleave) are undone here, so the kernel's unpack is the same shift-and-mask for every type.
* KIND_INT8: ``w`` (rows, cols) int8 codes, per-32 scale, bias zero (Q8_0).

One layout family means one kernel: the only per-type parameters are ``group`` (32, or 16 for
Q6_K) and ``hi_bits``.  K-quants' 6-bit packed sub-block scales and mins are folded at load into
per-group f32 ``scale`` / ``bias`` (d * sc, -(dmin * m)), so the kernel never decodes them.

Exactness: for every type marked exact, each product scale * code is exactly representable in
f32 (f16 d has 11 significant bits, sub-block scales <= 7 bits, codes <= 6 bits: <= 24 bits), so
``scale * code + bias`` rounds once, at the add, exactly as gguf-py / ggml do; a fused
multiply-add in the kernel gives the same result.  Q4_0 / Q5_0 / Q6_K fold ggml's ``d * (q - z)``
into ``d * q + (-z * d)``: both sides are exact there, so the values are equal; only the sign of
a zero may differ (ggml gives -0.0 at q == z when d < 0, this gives +0.0), which no matmul sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localinfer.errors import UnsupportedModelError

KIND_FLOAT = 0  # w: the float matrix
KIND_NIBBLE = 1  # 4-bit low codes (+ optional 1 or 2 high bits), per-group scale and bias
KIND_INT8 = 2  # signed int8 codes, per-group scale (bias zeros)

_FLOATS = {"F32": (np.float32, "float32"), "F16": (np.float16, "float16"),
           "BF16": (np.uint16, "bfloat16")}
_VIA_F16 = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
_CHUNK = 1 << 22  # elements decoded at a time: bounds the uint8/f32 temporaries to a few MiB
_U4 = np.uint8(4)


@dataclass(slots=True)
class Relaid:
    kind: int  # KIND_FLOAT, KIND_NIBBLE or KIND_INT8
    rows: int  # output features (ggml shape[1])
    cols: int  # input features (ggml shape[0])
    group: int  # weights per scale: 32, 16 for Q6_K; 0 for KIND_FLOAT
    hi_bits: int  # 0, 1 (Q5_0, Q5_1, Q5_K) or 2 (Q6_K)
    w: np.ndarray  # FLOAT (rows, cols) f32 | f16 | uint16 (bf16 bits); NIBBLE (rows, cols // 2)
    #                uint8, element 2j low nibble, 2j+1 high; INT8 (rows, cols) int8
    hi: np.ndarray  # (rows, cols * hi_bits // 8) uint8
    scale: np.ndarray  # (rows, cols // group) f32; (rows, 0) for KIND_FLOAT
    bias: np.ndarray  # like scale; zeros for KIND_INT8
    float_dtype: str  # KIND_FLOAT: "float32" | "float16" | "bfloat16"; else ""
    exact: bool  # dequantize() equals gguf.quants.dequantize (see the module docstring)

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32, computed the way the kernel does (a reference, not fast)."""
        if self.kind == KIND_FLOAT:
            if self.float_dtype == "bfloat16":
                return (self.w.astype(np.uint32) << np.uint32(16)).view(np.float32)
            return self.w.astype(np.float32)
        if self.kind == KIND_INT8:
            codes = self.w.astype(np.float32)
        else:
            c = np.empty((self.rows, self.cols), np.uint8)
            c[:, 0::2] = self.w & np.uint8(15)
            c[:, 1::2] = self.w >> _U4
            if self.hi_bits == 1:
                c |= np.unpackbits(self.hi, axis=1, bitorder="little") << _U4
            elif self.hi_bits == 2:
                shifts = np.array([0, 2, 4, 6], np.uint8)
                c |= ((self.hi[:, :, None] >> shifts) & np.uint8(3)).reshape(c.shape) << _U4
            codes = c.astype(np.float32)
        codes = codes.reshape(self.rows, -1, self.group)
        value = self.scale[:, :, None] * codes
        if self.kind == KIND_NIBBLE:  # INT8's bias is zero: adding it would turn -0.0 into +0.0
            value = value + self.bias[:, :, None]
        return value.reshape(self.rows, self.cols)


# Block decoders: (n, nb, block_bytes) uint8 -> codes (n, nb * block) in element order,
# scale (n, groups) f32, bias (n, groups) f32 or None (zeros).  Layouts follow ggml-common.h.
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nib32(qs: np.ndarray) -> np.ndarray:
    # 32-element blocks: byte i holds element i (low nibble) and element i + 16 (high nibble)
    return np.concatenate([qs & np.uint8(15), qs >> _U4], axis=-1)


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def _q8_0(b: np.ndarray) -> Decoded:
    return _flat(b[..., 2:34].view(np.int8)), _f16(b, 0), None


def _q4_0(b: np.ndarray) -> Decoded:
    d = _f16(b, 0)
    return _flat(_nib32(b[..., 2:18])), d, np.float32(-8) * d


def _q4_1(b: np.ndarray) -> Decoded:
    return _flat(_nib32(b[..., 4:20])), _f16(b, 0), _f16(b, 2)


def _q5(b: np.ndarray, qh_at: int) -> np.ndarray:
    # qh: a little-endian uint32 whose bit i is bit 4 of element i
    qh = np.unpackbits(b[..., qh_at : qh_at + 4], axis=-1, bitorder="little")
    return _flat(_nib32(b[..., qh_at + 4 : qh_at + 20]) | (qh << _U4))


def _q5_0(b: np.ndarray) -> Decoded:
    d = _f16(b, 0)
    return _q5(b, 2), d, np.float32(-16) * d


def _q5_1(b: np.ndarray) -> Decoded:
    return _q5(b, 4), _f16(b, 0), _f16(b, 2)


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: (d * sc, -(dmin * m)) per 32-weight sub-block, (n, nb * 8) f32 each."""
    s = b[..., 4:16].reshape(*b.shape[:2], 3, 4)
    lo, mn, hi = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & np.uint8(63), (hi & np.uint8(15)) | ((lo >> 2) & np.uint8(48))], -1)
    m = np.concatenate([mn & np.uint8(63), (hi >> _U4) | ((mn >> 2) & np.uint8(48))], -1)
    # the products ggml forms (d1 = d * sc, m1 = dmin * m): negating m1 keeps d1 * q - m1 exact
    scale = _f16(b, 0)[..., None] * sc.astype(np.float32)
    bias = -(_f16(b, 2)[..., None] * m.astype(np.float32))
    return _flat(scale), _flat(bias)


def _k_low(qs: np.ndarray) -> np.ndarray:
    # 64-element chunks: byte i holds element i (low nibble) and element i + 32 (high nibble)
    q = qs.reshape(*qs.shape[:2], -1, 1, 32)
    return np.concatenate([q & np.uint8(15), q >> _U4], axis=-2).reshape(*qs.shape[:2], -1)


def _q4_k(b: np.ndarray) -> Decoded:
    return (_flat(_k_low(b[..., 16:144])), *_k_scales(b))


def _q5_k(b: np.ndarray) -> Decoded:
    # qh[i] bit j is bit 4 of element 32 * j + i
    shifts = np.arange(8, dtype=np.uint8)[:, None]
    qh = ((b[..., None, 16:48] >> shifts) & np.uint8(1)).reshape(*b.shape[:2], 256)
    return (_flat(_k_low(b[..., 48:176]) | (qh << _U4)), *_k_scales(b))


def _q6_k(b: np.ndarray) -> Decoded:
    n, nb = b.shape[:2]
    # per 128-element half: ql's 64 bytes give elements i and i + 64 (low / high nibble), qh's
    # 32 bytes give bits 4..5 of elements i, i + 32, i + 64, i + 96 (bit pairs 0, 2, 4, 6)
    ql = b[..., 0:128].reshape(n, nb, 2, 1, 64)
    lo = np.concatenate([ql & np.uint8(15), ql >> _U4], axis=-2).reshape(n, nb, 2, 128)
    shifts = np.array([0, 2, 4, 6], np.uint8)[:, None]
    hi = ((b[..., 128:192].reshape(n, nb, 2, 1, 32) >> shifts) & np.uint8(3))
    codes = lo | (hi.reshape(n, nb, 2, 128) << _U4)
    scale = _flat(_f16(b, 208)[..., None] * b[..., 192:208].view(np.int8).astype(np.float32))
    return _flat(codes), scale, np.float32(-32) * scale


# name: (block elements, block bytes, group, hi_bits, decoder)
_QUANTS: dict[str, tuple[int, int, int, int, Callable[[np.ndarray], Decoded]]] = {
    "Q8_0": (32, 34, 32, 0, _q8_0), "Q4_0": (32, 18, 32, 0, _q4_0),
    "Q4_1": (32, 20, 32, 0, _q4_1), "Q5_0": (32, 22, 32, 1, _q5_0),
    "Q5_1": (32, 24, 32, 1, _q5_1), "Q4_K": (256, 144, 32, 0, _q4_k),
    "Q5_K": (256, 176, 32, 1, _q5_k), "Q6_K": (256, 210, 16, 2, _q6_k),
}
# every type relayout() reads: exactly (floats, the affine quants), then through f16
SUPPORTED_TYPES = (*_FLOATS, *_QUANTS, *_VIA_F16)


def _pack(codes: np.ndarray, hi_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 codes (n, cols) -> (w, hi) in the NIBBLE layout."""
    w = (codes[:, 0::2] & np.uint8(15)) | (codes[:, 1::2] << _U4)  # uint8 shift drops bits 4+
    h = codes >> _U4
    if hi_bits == 1:
        return w, np.packbits(h, axis=1, bitorder="little")
    if hi_bits == 2:
        return w, h[:, 0::4] | (h[:, 1::4] << 2) | (h[:, 2::4] << _U4) | (h[:, 3::4] << 6)
    return w, np.zeros((codes.shape[0], 0), np.uint8)


def relayout(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> Relaid:
    """raw: the tensor's bytes (uint8, as GGUFFile.raw(name) returns); shape: ggml order
    (cols, rows), or (n,) for 1-D (then rows=1); dims past the second are folded into rows.
    Raises UnsupportedModelError naming the type for any type it has no layout for."""
    cols = int(shape[0])
    rows = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    raw = np.ascontiguousarray(raw).reshape(-1)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    step = max(1, _CHUNK // max(cols, 1))  # rows decoded per chunk
    none = np.zeros((rows, 0), np.float32)
    if type_name in _FLOATS:
        dtype, name = _FLOATS[type_name]
        _check(type_name, raw.size, rows * cols * np.dtype(dtype).itemsize)
        w = raw.view(dtype)  # a view, no copy (read-only when raw is the mapped file)
        return Relaid(KIND_FLOAT, rows, cols, 0, 0, w.reshape(rows, cols),
                      np.zeros((rows, 0), np.uint8), none, none, name, True)
    if type_name in _VIA_F16:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        qt = GGMLQuantizationType[type_name]
        block, size = GGML_QUANT_SIZES[qt]
        blocks = _blocks(type_name, raw, rows, cols, block, size)
        w = np.empty((rows, cols), np.float16)
        for r in range(0, rows, step):  # chunked: the f32 dequantization is 2x the output
            w[r : r + step] = dequantize(blocks[r : r + step].reshape(-1), qt).reshape(-1, cols)
        return Relaid(KIND_FLOAT, rows, cols, 0, 0, w, np.zeros((rows, 0), np.uint8),
                      none, none, "float16", False)
    if type_name not in _QUANTS:
        raise UnsupportedModelError(
            f"the Triton CUDA backend has no layout for weight type {type_name}")
    block, size, group, hi_bits, decode = _QUANTS[type_name]
    blocks = _blocks(type_name, raw, rows, cols, block, size)
    int8 = type_name == "Q8_0"
    groups = cols // group
    w = np.empty((rows, cols if int8 else cols // 2), np.int8 if int8 else np.uint8)
    hi = np.empty((rows, cols * hi_bits // 8), np.uint8)
    scale = np.empty((rows, groups), np.float32)
    bias = np.zeros((rows, groups), np.float32)
    for r in range(0, rows, step):
        codes, s, bs = decode(blocks[r : r + step])
        scale[r : r + step] = s
        if bs is not None:
            bias[r : r + step] = bs
        if int8:
            w[r : r + step] = codes
        else:
            w[r : r + step], hi[r : r + step] = _pack(codes, hi_bits)
    return Relaid(KIND_INT8 if int8 else KIND_NIBBLE, rows, cols, group, hi_bits, w, hi,
                  scale, bias, "", True)


def _check(type_name: str, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{type_name} tensor: {got} bytes, its shape needs {want}")


def _blocks(type_name: str, raw: np.ndarray, rows: int, cols: int, block: int, size: int
            ) -> np.ndarray:
    """raw as (rows, blocks per row, block bytes); cols must be a whole number of blocks."""
    if cols % block:
        raise ValueError(f"{type_name} tensor: {cols} columns is not a multiple of {block}")
    _check(type_name, raw.size, rows * (cols // block) * size)
    return raw.reshape(rows, cols // block, size)
