"""Shared helpers for reading ggml blocks: the raw bytes as (rows, blocks, bytes) views, the f16
fields inside them, and row-chunked unpacking."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .packed import Packed, concat_rows

ROW_CHUNK = 4096  # rows unpacked at a time: bounds the temporaries of big matrices (embeddings)

Unpack = Callable[[np.ndarray, int, int], Packed]


def row_chunked(unpack: Unpack) -> Unpack:
    """Run `unpack` on at most ROW_CHUNK rows at a time and stack the results."""
    def chunked(raw: np.ndarray, rows: int, cols: int) -> Packed:
        if rows <= ROW_CHUNK:
            return unpack(raw, rows, cols)
        by_row = np.asarray(raw).reshape(rows, -1)
        return concat_rows([unpack(by_row[r : r + ROW_CHUNK], min(ROW_CHUNK, rows - r), cols)
                            for r in range(0, rows, ROW_CHUNK)])

    chunked.__doc__ = unpack.__doc__
    return chunked


def block_view(raw: np.ndarray, rows: int, cols: int, block: int, size: int) -> np.ndarray:
    """Raw tensor bytes -> (rows, cols // block, size) uint8."""
    return np.asarray(raw).reshape(rows, cols // block, size)


def f16_field(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block, widened (exactly) to float32: (rows, n_blocks)."""
    return np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16)[:, :, 0].astype(
        np.float32)


def round_f16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest f16 (kept as float32): the avx512 tiles store block
    scales as f16, so both kernel paths read these same values."""
    return x.astype(np.float16).astype(np.float32)


def low_high_bits(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes holding element j in the low nibble and j + 16 in the high one -> (..., 32)
    codes in element order (the Q4_0 / Q5_0 / IQ4 pairing)."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-1)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """(..., 32) 4-bit codes -> (..., 16) bytes in the KIND_Q4 pairing (j low, j + 16 high)."""
    return np.ascontiguousarray(codes[..., :16] | (codes[..., 16:] << np.uint8(4)))
