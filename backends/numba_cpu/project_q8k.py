"""project_q8k: dispatch.project for weights that came from K-quants, with q8_K activations.

Same weight stacks and matmul kernels as dispatch.project; only the activation quantization
differs (kernels/quantize_q8k.py), as llama.cpp's does for those weight types.
"""

from __future__ import annotations

from numba import types
from numba.extending import overload

from .dispatch import project
from .isa import IsaType
from .kernels.matmul import matmul_f32, matmul_q4, matmul_q8
from .kernels.matmul_tiles import matmul_tiles
from .kernels.quantize_q8k import quantize_rows_q8k
from .quants.packed import KIND_F32, KIND_Q4
from .split_stack import is_split
from .tile_kind import stack_kind


def project_q8k(isa, ws, layer, x, qbuf, out):
    """out (n_tokens, rows) = x (n_tokens, cols) @ W[layer].T, x quantized in q8_K blocks
    (cols a multiple of 256)."""


@overload(project_q8k, jit_options={"nogil": True})
def _project_q8k(isa, ws, layer, x, qbuf, out):
    if not isinstance(isa, IsaType):
        return None
    if isa.isa == "generic":
        def generic(isa, ws, layer, x, qbuf, out):
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
            quantize_rows_q8k(x, xq, xd, xi, xs)
            if kind == KIND_Q4:
                matmul_q4(nib[layer], d[layer], m[layer], zero[layer], xq, xd, xi, xs, out)
            else:
                matmul_q8(q[layer], d[layer], m[layer], xq, xd, xs, out)
        return generic

    if stack_kind(ws) == KIND_F32:  # known while typing, as in dispatch.project
        def floats(isa, ws, layer, x, qbuf, out):
            matmul_f32(ws[5][layer], x, out)
        return floats

    def tiled(isa, ws, layer, x, qbuf, out):
        kind, zero, w, d, m, wf = ws
        n_tokens, cols = x.shape
        nb = cols // 32
        xq = qbuf[0][:n_tokens]
        xd = qbuf[1][:n_tokens, :nb]
        xi = qbuf[2][:n_tokens, :nb]
        xs = qbuf[3][:n_tokens, :nb]
        quantize_rows_q8k(x, xq[:, :cols], xd, xi, xs)
        matmul_tiles(isa, kind, zero[layer], w[layer], d[layer], m[layer], xq, xd, xi, xs, out)
    return tiled


def project_as(isa, ws, layer, x, qbuf, out, q8k, role):
    """project, or project_q8k where role `role`'s weights are K-quants (LlamaWeights.q8k);
    ws a TileStack, WeightStack or SplitStack (split_stack.py)."""


@overload(project_as, jit_options={"nogil": True})
def _project_as(isa, ws, layer, x, qbuf, out, q8k, role):
    if is_split(ws):
        # each layer from its kind's stack; q8k stays indexed by the model's layer
        def split(isa, ws, layer, x, qbuf, out, q8k, role):
            wide, narrow, where = ws
            j = where[layer]
            if j >= 0:
                _project_one(isa, wide, j, x, qbuf, out, q8k, role, layer)
            else:
                _project_one(isa, narrow, -1 - j, x, qbuf, out, q8k, role, layer)
        return split

    def whole(isa, ws, layer, x, qbuf, out, q8k, role):
        _project_one(isa, ws, layer, x, qbuf, out, q8k, role, layer)
    return whole


def _project_one(isa, ws, index, x, qbuf, out, q8k, role, layer):
    """project_as on layer `index` of the TileStack or WeightStack ws, which is model layer
    `layer` (the one q8k names)."""


@overload(_project_one, jit_options={"nogil": True})
def _project_one_impl(isa, ws, index, x, qbuf, out, q8k, role, layer):
    if isinstance(q8k, types.NoneType):
        # a model without K-quants: the q8_K path is never typed, so never compiled (a first
        # run on a new machine compiles only what the model calls)
        def plain(isa, ws, index, x, qbuf, out, q8k, role, layer):
            project(isa, ws, index, x, qbuf, out)
        return plain

    def either(isa, ws, index, x, qbuf, out, q8k, role, layer):
        if q8k[role, layer]:
            project_q8k(isa, ws, index, x, qbuf, out)
        else:
            project(isa, ws, index, x, qbuf, out)
    return either
