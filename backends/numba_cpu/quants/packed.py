"""Packed weight layouts the matmul kernels read, shared by every quant family.

A GGUF tensor is converted at load into one of three kernel layouts ("kinds"):

- KIND_Q4: 4-bit codes, blocks of 32 — nib (rows, n_blocks, 16) uint8 holding element j in the
  low nibble and element j+16 in the high nibble (ggml's order), plus per-block d and m (f32):
  w = d * (code - zero) + m.  Q4_0 is zero=8, m=0; Q4_1 is zero=0.
- KIND_Q8: signed 8-bit codes, blocks of 32 — q (rows, n_blocks, 32) int8, d, m: w = d * q + m.
- KIND_F32: plain float32 (rows, cols).

Every 4-bit matrix converts exactly into KIND_Q8 and everything converts into KIND_F32, so a
weight role whose layers (or merged Q/K/V parts) mix types is stored in the widest kind needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KIND_Q4 = 4
KIND_Q8 = 8
KIND_F32 = 32
QBLOCK = 32  # elements per quantization block in the Q4/Q8 layouts

WIDTH = {KIND_Q4: 0, KIND_Q8: 1, KIND_F32: 2}


@dataclass(slots=True)
class Packed:
    """One weight matrix (rows, cols) in a kernel layout."""

    kind: int
    rows: int
    cols: int
    nib: np.ndarray | None = None  # (rows, n_blocks, 16) uint8, KIND_Q4
    q: np.ndarray | None = None  # (rows, n_blocks, 32) int8, KIND_Q8
    d: np.ndarray | None = None  # (rows, n_blocks) float32
    m: np.ndarray | None = None  # (rows, n_blocks) float32
    zero: int = 0  # KIND_Q4 code offset
    w: np.ndarray | None = None  # (rows, cols) float32, KIND_F32

    def to_kind(self, kind: int) -> Packed:
        """Convert (losslessly) into a wider layout."""
        if kind == self.kind:
            return self
        if WIDTH[kind] < WIDTH[self.kind]:
            raise ValueError(f"cannot narrow kind {self.kind} to {kind}")
        if self.kind == KIND_Q4:
            lo = (self.nib & 15).astype(np.int8) - np.int8(self.zero)
            hi = (self.nib >> 4).astype(np.int8) - np.int8(self.zero)
            q = np.concatenate([lo, hi], axis=2)  # (rows, n_blocks, 32)
            as_q8 = Packed(KIND_Q8, self.rows, self.cols, q=q, d=self.d, m=self.m)
            return as_q8.to_kind(kind)
        # KIND_Q8 -> KIND_F32
        w = self.q.astype(np.float32) * self.d[:, :, None] + self.m[:, :, None]
        return Packed(KIND_F32, self.rows, self.cols, w=w.reshape(self.rows, self.cols))

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32 — for tests and for the embedding table."""
        return self.to_kind(KIND_F32).w


def concat_rows(parts: list[Packed]) -> Packed:
    """Stack matrices with equal cols along rows, in the widest kind among them."""
    kind = max((p.kind for p in parts), key=WIDTH.__getitem__)
    parts = [p.to_kind(kind) for p in parts]
    zeros = {p.zero for p in parts}
    if kind == KIND_Q4 and len(zeros) > 1:  # Q4_0 next to Q4_1: go to 8 bits
        kind = KIND_Q8
        parts = [p.to_kind(kind) for p in parts]
    rows = sum(p.rows for p in parts)
    first = parts[0]

    def cat(attr: str) -> np.ndarray | None:
        arrays = [getattr(p, attr) for p in parts]
        return None if arrays[0] is None else np.ascontiguousarray(np.concatenate(arrays))

    return Packed(kind, rows, first.cols, nib=cat("nib"), q=cat("q"), d=cat("d"), m=cat("m"),
                  zero=first.zero, w=cat("w"))
