"""The model's tensors on the device: re-laid once at load (relayout.py), then kept quantized.

A projection role (Q|K|V, O, gate|up, down, the output head) is a Projection: its source
tensors stacked along the output rows, as few parts as their formats allow.  Tensors of one
format merge into one matrix, so a llama Q4_0 file runs Q, K and V as one launch; a Q4_K_M
file, whose V is Q6_K, runs Q|K as one part and V as another, each writing its own columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from localinfer.errors import UnsupportedModelError

from .relayout import SUPPORTED_TYPES, Relaid, relayout

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


@dataclass(slots=True)
class GpuWeight:
    kind: int
    hi_bits: int
    group: int
    rows: int
    cols: int
    w: torch.Tensor
    hi: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def upload(cls, r: Relaid, device: torch.device) -> GpuWeight:
        def put(a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
            if a.size == 0:  # a valid pointer the kernel never reads
                return torch.zeros(1, dtype=dtype or torch.float32, device=device)
            a = np.ascontiguousarray(a)
            if device.type == "cpu" or not a.flags.writeable:  # e.g. F16 straight from the map
                a = a.copy()  # torch wants writable memory; the GPU copy is the one kept anyway
            t = torch.from_numpy(a)
            return (t if dtype is None else t.view(dtype)).to(device)

        w = put(r.w, torch.bfloat16 if r.float_dtype == "bfloat16" else None)
        return cls(r.kind, r.hi_bits, r.group, r.rows, r.cols, w, put(r.hi, torch.uint8),
                   put(r.scale), put(r.bias))


Projection = list[tuple[int, GpuWeight]]  # (first output row, part)


def _fmt(r: Relaid) -> tuple:
    return (r.kind, r.hi_bits, r.group, r.float_dtype, r.cols)


def merge_rows(parts: list[Relaid]) -> list[tuple[int, Relaid]]:
    """Consecutive parts of one format stacked into one matrix: [(first row, matrix)]."""
    out: list[tuple[int, list[Relaid]]] = []
    row = 0
    for p in parts:
        if out and _fmt(out[-1][1][0]) == _fmt(p):
            out[-1][1].append(p)
        else:
            out.append((row, [p]))
        row += p.rows
    merged = []
    for first, group in out:
        if len(group) == 1:
            merged.append((first, group[0]))
            continue
        g0 = group[0]
        w, hi, scale, bias = (np.concatenate([getattr(p, name) for p in group])
                              for name in ("w", "hi", "scale", "bias"))
        merged.append((first, Relaid(kind=g0.kind, rows=sum(p.rows for p in group),
                                     cols=g0.cols, group=g0.group, hi_bits=g0.hi_bits, w=w,
                                     hi=hi, scale=scale, bias=bias, float_dtype=g0.float_dtype,
                                     exact=all(p.exact for p in group))))
    return merged


@dataclass(slots=True)
class TritonWeights:
    embd: GpuWeight  # (n_vocab, n_embd)
    head: Projection  # (n_vocab, n_embd); the embedding itself when tied
    out_norm: torch.Tensor  # (n_embd,)
    attn_norm: list[torch.Tensor]  # per layer (n_embd,)
    ffn_norm: list[torch.Tensor]
    wqkv: list[Projection]  # ((n_heads + 2 n_kv) head_dim, n_embd)
    wo: list[Projection]  # (n_embd, n_heads head_dim)
    wgu: list[Projection]  # (2 n_ff, n_embd): gate rows then up rows
    wdown: list[Projection]  # (n_embd, n_ff)
    bqkv: list[torch.Tensor | None]  # qwen2's Q|K|V biases
    # gemma3: per-head Q/K norms and the norms after attention and the FFN
    extra: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def load(cls, g: GGUFFile, c: ModelConfig, device: torch.device) -> TritonWeights:
        for name in c.expected_tensors():  # refuse an unknown type before any upload
            info = g.tensors[name]
            if len(info.shape) > 1:
                relayout_check(info.type_name, name)

        def relaid(name: str) -> Relaid:
            info = g.tensors[name]
            return relayout(info.type_name, g.raw(name), tuple(info.shape))

        def proj(*names: str) -> Projection:
            return [(first, GpuWeight.upload(r, device))
                    for first, r in merge_rows([relaid(n) for n in names])]

        def vec(name: str) -> torch.Tensor:
            a = np.asarray(g.array(name), np.float32).reshape(-1)
            return torch.from_numpy(a.copy()).to(device)

        blk = "blk.{}.{}".format
        layers = range(c.n_layers)
        embd = GpuWeight.upload(relaid("token_embd.weight"), device)
        head = [(0, embd)] if c.tied_embeddings else proj("output.weight")
        bqkv: list[torch.Tensor | None] = [None] * c.n_layers
        if c.qkv_bias:
            bqkv = [torch.cat([vec(blk(i, f"{t}.bias")) for t in ("attn_q", "attn_k", "attn_v")])
                    for i in layers]
        extra = {}
        if c.arch == "gemma3":
            extra = {role: [vec(blk(i, f"{role}.weight")) for i in layers]
                     for role in ("attn_q_norm", "attn_k_norm", "post_attention_norm",
                                  "post_ffw_norm")}
        return cls(
            embd=embd, head=head, out_norm=vec("output_norm.weight"),
            attn_norm=[vec(blk(i, "attn_norm.weight")) for i in layers],
            ffn_norm=[vec(blk(i, "ffn_norm.weight")) for i in layers],
            wqkv=[proj(*(blk(i, f"{t}.weight") for t in ("attn_q", "attn_k", "attn_v")))
                  for i in layers],
            wo=[proj(blk(i, "attn_output.weight")) for i in layers],
            wgu=[proj(blk(i, "ffn_gate.weight"), blk(i, "ffn_up.weight")) for i in layers],
            wdown=[proj(blk(i, "ffn_down.weight")) for i in layers],
            bqkv=bqkv, extra=extra,
        )


def relayout_check(type_name: str, name: str) -> None:
    if type_name not in SUPPORTED_TYPES:
        raise UnsupportedModelError(f"triton backend: tensor {name} has weight type "
                                    f"{type_name}, which it does not read (it reads "
                                    f"{', '.join(SUPPORTED_TYPES)})")
