"""embed_tiles: rows of a tiled weight matrix (quants/tiles.py), dequantized — the token
embedding of the vector paths, read from the same tiles as the output head when they are tied."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.packed import KIND_Q4, KIND_Q8
from ..quants.tiles import TILE_ROWS
from ..tile_kind import kind_of
from .f16 import f16_value


@njit(cache=True, nogil=True)
def embed_tiles(kind, zero, w, d, m, tokens, out):
    """Rows `tokens` of a tiled matrix, dequantized -> out (n_tokens, cols), with the same
    arithmetic as linear.embed_rows (so both paths embed bit for bit alike: 5-bit roles are
    KIND_Q8 there, so their codes - zero are float32 operands, as int8 codes are)."""
    nb = w.shape[1]
    k = kind_of(kind)
    for i in range(tokens.shape[0]):
        t, lane = divmod(tokens[i], TILE_ROWS)
        for b in range(nb):
            scale = f16_value(d[t, b, lane])
            bias = f16_value(m[t, b, lane]) if m.size else np.float32(0.0)
            for e in range(32):
                if k == KIND_Q8:
                    c = np.int64(w[t, b, 64 * (e // 4) + 4 * lane + e % 4]) - 128
                    out[i, b * 32 + e] = scale * np.float32(c) + bias
                    continue
                byte = w[t, b, 64 * ((e % 16) // 4) + 4 * lane + e % 4]
                c = np.int64(byte & 15) if e < 16 else np.int64(byte >> 4)
                if k == KIND_Q4:
                    out[i, b * 32 + e] = scale * (c - zero) + bias
                else:  # KIND_Q5: bit e // 4 of the plane byte at the same position
                    high = (np.int64(w[t, b, 256 + 4 * lane + e % 4]) >> (e // 4)) & 1
                    out[i, b * 32 + e] = scale * np.float32(c + 16 * high - zero) + bias
