"""Importance-weighted Q4_0, Q4_1, Q5_0 and Q5_1 (ggml's quantize_row_q*_impl with quant_weights).

Each kernel: (x (rows, n) float32, out (rows, row_bytes) uint8, qw (n,) float32).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .numerics import f32, put_f16
from .rows import WORKERS, claim
from .weighted_search import (
    block_weights,
    make_qkx3_quants,
    make_qx_quants_w,
    row_sigma2,
)


@njit(cache=True, parallel=True)
def quantize_q4_0_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                o = out[r, 18 * b:18 * b + 18]
                put_f16(o, 0, make_qx_quants_w(32, 8, xb, L, w))
                for j in range(16):
                    o[2 + j] = L[j] | (L[j + 16] << 4)
            r = claim(nxt)


@njit(cache=True, parallel=True)
def quantize_q5_0_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                o = out[r, 22 * b:22 * b + 22]
                put_f16(o, 0, make_qx_quants_w(32, 16, xb, L, w))
                _pack5(o, 2, L)
            r = claim(nxt)


@njit(cache=True, inline="always")
def _pack5(o: np.ndarray, at: int, L: np.ndarray) -> None:
    """qh (u32 LE) at o[at:at+4], then qs[16]: low nibbles of values j and j+16."""
    qh = 0
    for j in range(16):
        a = L[j]
        b = L[j + 16]
        o[at + 4 + j] = (a & 15) | ((b & 15) << 4)
        qh |= ((a & 16) >> 4) << j
        qh |= ((b & 16) >> 4) << (j + 16)
    for k in range(4):
        o[at + k] = (qh >> (8 * k)) & 0xFF


@njit(cache=True, parallel=True)
def _qkx_32(x: np.ndarray, out: np.ndarray, qw: np.ndarray, nmax: int, type_size: int) -> None:
    """Q4_1 / Q5_1 weighted: make_qkx3_quants per block, then d, m and the codes."""
    nxt = np.zeros(1, np.int64)
    for _ in prange(WORKERS):
        L = np.zeros(32, np.int32)
        Laux = np.zeros(32, np.int32)
        w = np.zeros(32, np.float32)
        r = claim(nxt)
        while r < x.shape[0]:
            sigma2 = row_sigma2(x[r])
            for b in range(x.shape[1] // 32):
                xb = x[r, 32 * b:32 * b + 32]
                block_weights(xb, qw[32 * b:32 * b + 32], sigma2, w)
                d, m = make_qkx3_quants(32, nmax, xb, w, L, Laux, f32(-0.9), f32(0.05), 36)
                o = out[r, type_size * b:type_size * b + type_size]
                put_f16(o, 0, d)
                put_f16(o, 2, -m)
                if nmax == 15:
                    for j in range(16):
                        o[4 + j] = L[j] | (L[j + 16] << 4)
                else:
                    _pack5(o, 4, L)
            r = claim(nxt)


@njit(cache=True)
def quantize_q4_1_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    _qkx_32(x, out, qw, 15, 20)


@njit(cache=True)
def quantize_q5_1_w(x: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    _qkx_32(x, out, qw, 31, 24)

