"""linear(): one weight matrix of a WeightStack applied to activation rows, dispatched on kind."""

from __future__ import annotations

from numba import njit

from .kernels.matmul import matmul_f32, matmul_q4, matmul_q8
from .kernels.quantize import quantize_rows
from .quants.packed import KIND_F32, KIND_Q4


@njit(cache=True, nogil=True)
def linear(ws, layer, x, qbuf, out):
    """x (n_tokens, cols) f32 -> out (n_tokens, rows) with layer `layer` of WeightStack ws.

    qbuf = (xq, xd, xi, xs) scratch for the int8 activations, at least (n_tokens, cols)."""
    kind, nib, q, d, m, zero, w = ws
    if kind == KIND_F32:
        matmul_f32(w[layer], x, out)
        return
    n_tokens, cols = x.shape
    nb = cols // 32
    xq = qbuf[0][:n_tokens, :cols]
    xd = qbuf[1][:n_tokens, :nb]
    xi = qbuf[2][:n_tokens, :nb]
    xs = qbuf[3][:n_tokens, :nb]
    quantize_rows(x, xq, xd, xi, xs)
    if kind == KIND_Q4:
        matmul_q4(nib[layer], d[layer], m[layer], zero[layer], xq, xd, xi, xs, out)
    else:
        matmul_q8(q[layer], d[layer], m[layer], xq, xd, xs, out)


@njit(cache=True, nogil=True)
def embed_rows(ws, tokens, out):
    """Rows `tokens` of layer 0 of ws, dequantized -> out (n_tokens, cols)."""
    kind, nib, q, d, m, zero, w = ws
    for i in range(tokens.shape[0]):
        t = tokens[i]
        if kind == KIND_F32:
            out[i, :] = w[0, t]
            continue
        for b in range(d.shape[2]):
            scale = d[0, t, b]
            bias = m[0, t, b]
            for j in range(32):
                if kind == KIND_Q4:
                    byte = nib[0, t, b, j % 16]
                    code = (byte & 15) if j < 16 else (byte >> 4)
                    c = code - zero[0]
                else:
                    c = q[0, t, b, j]
                out[i, b * 32 + j] = scale * c + bias
