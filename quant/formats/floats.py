"""F32, F16 and BF16: plain element types, converted with numpy (round to nearest even, like
ggml_fp32_to_fp16_row and ggml_fp32_to_bf16_row_ref)."""

from __future__ import annotations

import numpy as np

from .base import QuantFormat


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # quiet the NaN, keep its sign and top payload bits
        rounded[nan] = ((u[nan] >> 16) | 64).astype(np.uint16)
    return rounded


class _Plain(QuantFormat):
    block_size = 1
    dtype: np.dtype

    @classmethod
    def _to_bits(cls, x: np.ndarray) -> np.ndarray:
        return x.astype(cls.dtype)

    @classmethod
    def quantize(cls, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        bits = np.ascontiguousarray(cls._to_bits(x))
        return bits.view(np.uint8).reshape(*x.shape[:-1], x.shape[-1] * cls.type_size)

    @classmethod
    def dequantize(cls, q: np.ndarray, n: int) -> np.ndarray:
        q = np.ascontiguousarray(q, dtype=np.uint8)
        vals = q.view(cls.dtype).reshape(*q.shape[:-1], n)
        if cls.dtype == np.uint16:  # BF16: the high half of a float32
            return (vals.astype(np.uint32) << 16).view(np.float32)
        return vals.astype(np.float32)


class F32(_Plain):
    name = "F32"
    ggml_type = 0
    type_size = 4
    dtype = np.dtype("<f4")


class F16(_Plain):
    name = "F16"
    ggml_type = 1
    type_size = 2
    dtype = np.dtype("<f2")


class BF16(_Plain):
    name = "BF16"
    ggml_type = 30
    type_size = 2
    dtype = np.dtype("<u2")

    @classmethod
    def _to_bits(cls, x: np.ndarray) -> np.ndarray:
        return fp32_to_bf16_bits(x)
