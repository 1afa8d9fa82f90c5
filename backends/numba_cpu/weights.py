"""LlamaWeights: the model's tensors repacked for the kernels, stacked per role over layers.

Roles: wqkv (Q, K and V rows merged into one matrix), wo, wgu (gate and up rows merged, so one
pass computes both halves of SwiGLU), wdown, plus the token embedding, the output head (the
embedding itself when tied) and the norm weights.  Stacking lets one jitted call run every
layer.  Each role is handed to Numba as a WeightStack tuple
    (kind, nib, q, d, m, zero, w)
with kind from quants.packed and the arrays of the other kinds left empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .quants import KIND_F32, KIND_Q4, KIND_Q8, Packed, concat_rows, format_for, unpack_tensor
from .quants.packed import WIDTH

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig

WeightStack = tuple  # (kind, nib, q, d, m, zero, w) — see module docstring


def load_packed(g: GGUFFile, name: str) -> Packed:
    info = g.tensors[name]
    return unpack_tensor(name, info.ggml_type, info.type_name, g.raw(name), tuple(info.shape))


def stack(layers: list[Packed]) -> WeightStack:
    """Per-layer matrices of one role -> WeightStack with a leading layer axis."""
    kind = max((p.kind for p in layers), key=WIDTH.__getitem__)
    n = len(layers)
    first = layers[0]
    rows, cols, nb = first.rows, first.cols, first.cols // 32
    nib = np.empty((0, 0, 0, 16), np.uint8)
    q = np.empty((0, 0, 0, 32), np.int8)
    d = np.empty((0, 0, 0), np.float32)
    m = np.empty((0, 0, 0), np.float32)
    w = np.empty((0, 0, 0), np.float32)
    zero = np.zeros(n, np.int64)
    if kind == KIND_Q4:
        nib = np.empty((n, rows, nb, 16), np.uint8)
    elif kind == KIND_Q8:
        q = np.empty((n, rows, nb, 32), np.int8)
    else:
        w = np.empty((n, rows, cols), np.float32)
    if kind != KIND_F32:
        d = np.empty((n, rows, nb), np.float32)
        m = np.empty((n, rows, nb), np.float32)
    for i, p in enumerate(layers):  # fill in place: peak memory stays ~ one layer above final
        p = p.to_kind(kind)
        if kind == KIND_Q4:
            nib[i], zero[i] = p.nib, p.zero
        elif kind == KIND_Q8:
            q[i] = p.q
        else:
            w[i] = p.w
        if kind != KIND_F32:
            d[i], m[i] = p.d, p.m
    return (kind, nib, q, d, m, zero, w)


@dataclass(slots=True)
class LlamaWeights:
    embd: WeightStack  # (1, n_vocab, n_embd)
    head: WeightStack  # (1, n_vocab, n_embd); the same arrays as embd when tied
    out_norm: np.ndarray  # (n_embd,)
    attn_norm: np.ndarray  # (n_layers, n_embd)
    ffn_norm: np.ndarray  # (n_layers, n_embd)
    wqkv: WeightStack  # (n_layers, (n_heads + 2 n_kv_heads) head_dim, n_embd)
    wo: WeightStack  # (n_layers, n_embd, n_heads head_dim)
    wgu: WeightStack  # (n_layers, 2 n_ff, n_embd): gate rows then up rows
    wdown: WeightStack  # (n_layers, n_embd, n_ff)

    @classmethod
    def load(cls, g: GGUFFile, config: ModelConfig) -> LlamaWeights:
        """Repack every tensor; unsupported types raise UnsupportedModelError naming them."""
        for name in config.expected_tensors():  # fail fast, before any big copy
            info = g.tensors[name]
            format_for(name, info.ggml_type, info.type_name)

        def norm(name: str) -> np.ndarray:
            return np.asarray(g.array(name), dtype=np.float32).reshape(-1)

        layers = range(config.n_layers)
        blk = "blk.{}.{}.weight".format
        embd = stack([load_packed(g, "token_embd.weight")])
        head = embd if config.tied_embeddings else stack([load_packed(g, "output.weight")])
        return cls(
            embd=embd,
            head=head,
            out_norm=norm("output_norm.weight"),
            attn_norm=np.stack([norm(blk(i, "attn_norm")) for i in layers]),
            ffn_norm=np.stack([norm(blk(i, "ffn_norm")) for i in layers]),
            wqkv=stack([concat_rows([load_packed(g, blk(i, t)) for t in
                                     ("attn_q", "attn_k", "attn_v")]) for i in layers]),
            wo=stack([load_packed(g, blk(i, "attn_output")) for i in layers]),
            wgu=stack([concat_rows([load_packed(g, blk(i, t)) for t in ("ffn_gate", "ffn_up")])
                       for i in layers]),
            wdown=stack([load_packed(g, blk(i, "ffn_down")) for i in layers]),
        )

    def nbytes(self) -> int:
        arrays = [self.out_norm, self.attn_norm, self.ffn_norm]
        stacks = [self.embd, self.wqkv, self.wo, self.wgu, self.wdown]
        if self.head is not self.embd:
            stacks.append(self.head)
        return sum(a.nbytes for a in arrays) + sum(a.nbytes for s in stacks for a in s[1:])
