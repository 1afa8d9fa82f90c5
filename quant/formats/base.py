"""QuantFormat: one ggml block format, described by its sizes and its two Numba row kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np


class QuantFormat:
    """A ggml tensor type. Subclasses set the class attributes; kernels work on whole rows.

    quantize(x): float32 (..., n) -> uint8 (..., n // block_size * type_size)
    dequantize(q, n): uint8 (..., row_bytes) -> float32 (..., n)
    """

    name: ClassVar[str]
    ggml_type: ClassVar[int]  # gguf.GGMLQuantizationType value
    block_size: ClassVar[int]  # elements per block
    type_size: ClassVar[int]  # bytes per block
    # kernels: (x (rows, n) float32, out (rows, row_bytes) uint8) and the reverse
    quantize_rows: ClassVar[Callable[[np.ndarray, np.ndarray], None]]
    dequantize_rows: ClassVar[Callable[[np.ndarray, np.ndarray], None]]

    @classmethod
    def row_bytes(cls, n: int) -> int:
        if n % cls.block_size:
            raise ValueError(f"{cls.name}: row length {n} is not a multiple of {cls.block_size}")
        return n // cls.block_size * cls.type_size

    @classmethod
    def quantize(cls, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        n = x.shape[-1]
        rb = cls.row_bytes(n)
        rows = np.ascontiguousarray(x.reshape(-1, n), dtype=np.float32)
        out = np.empty((rows.shape[0], rb), dtype=np.uint8)
        if rows.size:
            cls.quantize_rows(rows, out)
        return out.reshape(*x.shape[:-1], rb)

    @classmethod
    def dequantize(cls, q: np.ndarray, n: int) -> np.ndarray:
        q = np.asarray(q, dtype=np.uint8)
        rb = cls.row_bytes(n)
        if q.shape[-1] != rb:
            raise ValueError(f"{cls.name}: rows of {n} values need {rb} bytes, got {q.shape[-1]}")
        rows = np.ascontiguousarray(q.reshape(-1, rb))
        out = np.empty((rows.shape[0], n), dtype=np.float32)
        if rows.size:
            cls.dequantize_rows(rows, out)
        return out.reshape(*q.shape[:-1], n)

    def __repr__(self) -> str:
        return f"<{self.name}: {self.block_size} values in {self.type_size} bytes>"
