"""Packed weight layouts the matmul kernels read, shared by every quant family.

A GGUF tensor is converted at load into one of four kernel layouts ("kinds"):

- KIND_Q4: 4-bit codes, blocks of 32 — nib (rows, n_blocks, 16) uint8 holding element j in the
  low nibble and element j+16 in the high nibble (ggml's order), plus per-block d and m (f32):
  w = d * (code - zero) + m.  Q4_0 is zero=8, m=0; Q4_1 is zero=0.
- KIND_Q5: 5-bit codes — the low four bits as KIND_Q4's nib, the fifth bits in qh
  (rows, n_blocks, 4) uint8: bit e % 8 of byte e // 8 is element e's (ggml's qh, a
  little-endian u32), so code = nibble + 16 * bit.  w = d * (code - zero) + m: Q5_0 is
  zero=16, m=0; Q5_1 is zero=0.
- KIND_Q8: signed 8-bit codes, blocks of 32 — q (rows, n_blocks, 32) int8, d, m: w = d * q + m.
- KIND_F32: plain float32 (rows, cols).

Each kind converts exactly into every wider one (WIDTH: Q4 < Q5 < Q8 < F32; a 4-bit matrix
becomes 5-bit with its fifth bits 0 and the same zero), so a weight role whose layers (or
merged Q/K/V parts) mix types is stored in the widest kind needed.  Codes with different zeros
(Q4_0 next to Q4_1 or Q5_0) meet in KIND_Q8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KIND_Q4 = 4
KIND_Q5 = 5
KIND_Q8 = 8
KIND_F32 = 32
QBLOCK = 32  # elements per quantization block in the Q4/Q5/Q8 layouts
NIBBLE_KINDS = (KIND_Q4, KIND_Q5)  # the kinds with unsigned codes and a zero offset

WIDTH = {KIND_Q4: 0, KIND_Q5: 1, KIND_Q8: 2, KIND_F32: 3}


@dataclass(slots=True)
class Packed:
    """One weight matrix (rows, cols) in a kernel layout."""

    kind: int
    rows: int
    cols: int
    nib: np.ndarray | None = None  # (rows, n_blocks, 16) uint8, KIND_Q4 and KIND_Q5
    q: np.ndarray | None = None  # (rows, n_blocks, 32) int8, KIND_Q8
    d: np.ndarray | None = None  # (rows, n_blocks) float32
    m: np.ndarray | None = None  # (rows, n_blocks) float32
    zero: int = 0  # KIND_Q4 / KIND_Q5 code offset
    w: np.ndarray | None = None  # (rows, cols) float32, KIND_F32
    qh: np.ndarray | None = None  # (rows, n_blocks, 4) uint8 fifth bits, KIND_Q5

    def codes(self) -> np.ndarray:
        """KIND_Q4 / KIND_Q5: the unsigned codes (rows, n_blocks, 32) uint8 in element order."""
        c = np.concatenate([self.nib & np.uint8(15), self.nib >> np.uint8(4)], axis=2)
        if self.kind == KIND_Q5:
            c |= np.unpackbits(self.qh, axis=2, bitorder="little") << np.uint8(4)
        return c

    def to_kind(self, kind: int) -> Packed:
        """Convert (losslessly) into a wider layout."""
        if kind == self.kind:
            return self
        if WIDTH[kind] < WIDTH[self.kind]:
            raise ValueError(f"cannot narrow kind {self.kind} to {kind}")
        if kind == KIND_Q5:  # from KIND_Q4: no fifth bits, same zero
            qh = np.zeros((*self.nib.shape[:2], 4), np.uint8)
            return Packed(KIND_Q5, self.rows, self.cols, nib=self.nib, d=self.d, m=self.m,
                          zero=self.zero, qh=qh)
        if self.kind in NIBBLE_KINDS:  # codes 0..31 minus a zero <= 16 fit int8
            q = self.codes().astype(np.int8) - np.int8(self.zero)  # (rows, n_blocks, 32)
            as_q8 = Packed(KIND_Q8, self.rows, self.cols, q=q, d=self.d, m=self.m)
            return as_q8.to_kind(kind)
        # KIND_Q8 -> KIND_F32
        w = self.q.astype(np.float32) * self.d[:, :, None] + self.m[:, :, None]
        return Packed(KIND_F32, self.rows, self.cols, w=w.reshape(self.rows, self.cols))

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32 — for tests and for the embedding table."""
        return self.to_kind(KIND_F32).w


def common_kind(kinds: list[int], zeros: set[int]) -> int:
    """The kind a stack of matrices of these kinds and zeros takes: the widest, or KIND_Q8
    where 4- or 5-bit codes have different zeros (Q4_0 next to Q4_1, Q5_0 or Q4_K)."""
    kind = max(kinds, key=WIDTH.__getitem__)
    return KIND_Q8 if kind in NIBBLE_KINDS and len(zeros) > 1 else kind


def concat_rows(parts: list[Packed]) -> Packed:
    """Stack matrices with equal cols along rows, in the kind they share (common_kind)."""
    kind = common_kind([p.kind for p in parts], {p.zero for p in parts if p.kind in NIBBLE_KINDS})
    parts = [p.to_kind(kind) for p in parts]
    rows = sum(p.rows for p in parts)
    first = parts[0]

    def cat(attr: str) -> np.ndarray | None:
        arrays = [getattr(p, attr) for p in parts]
        return None if arrays[0] is None else np.ascontiguousarray(np.concatenate(arrays))

    return Packed(kind, rows, first.cols, nib=cat("nib"), q=cat("q"), d=cat("d"), m=cat("m"),
                  zero=first.zero, w=cat("w"), qh=cat("qh"))
