"""LlamaWeights: the model's tensors repacked for the kernels, stacked per role over layers.

Roles: wqkv (Q, K and V rows merged into one matrix), wo, wgu (gate and up rows merged, so one
pass computes both halves of SwiGLU), wdown, plus the token embedding, the output head (the
embedding itself when tied) and the norm weights.  Stacking lets one jitted call run every
layer.  Each role is handed to Numba as a WeightStack tuple
    (kind, nib, q, d, m, zero, w)
with kind from quants.packed and the arrays of the other kinds left empty; the generic kernels
read 5-bit roles as KIND_Q8 (stack converts them, exactly).  The vector paths read TileStack
tuples instead (quants/tiles.py layout):
    (kind, zero, w, d, m, wf)
kind a TileKind (tile_kind.py: the kind in the Numba type, so each role compiles only its own
kernel), zero (n_layers,) int64 code offsets (Q4_0: 8, Q4_1: 0, Q5_0: 16, Q8: 128), w/d/m per
layer tiles, wf the float32 matrices of a KIND_F32 role.  A layer role whose layers need
different kinds (llama.cpp's K-quant mixes) is a SplitStack of two TileStacks (split_stack.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .quants import (
    KIND_F32,
    KIND_Q4,
    KIND_Q5,
    KIND_Q8,
    Packed,
    concat_rows,
    format_for,
    unpack_tensor,
)
from .quants.packed import NIBBLE_KINDS, WIDTH, common_kind
from .quants.tiles import TILE_ROWS, tile_bytes, to_tiles
from .split_stack import split_tiles
from .tile_kind import TileKind

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig

WeightStack = tuple  # (kind, nib, q, d, m, zero, w) — see module docstring


def load_packed(g: GGUFFile, name: str) -> Packed:
    info = g.tensors[name]
    return unpack_tensor(name, info.ggml_type, info.type_name, g.raw(name), tuple(info.shape))


def stack(layers: Sequence[Packed], kind: int | None = None) -> WeightStack:
    """Per-layer matrices of one role -> WeightStack with a leading layer axis.  With `kind`
    given (LazyLayers.kind) each layer is read once, as the loop reaches it.  KIND_Q5 is
    stored as KIND_Q8: the generic kernels have no 5-bit loop, and the conversion is exact."""
    if kind is None:
        kind = max((p.kind for p in layers), key=WIDTH.__getitem__)
    if kind == KIND_Q5:
        kind = KIND_Q8
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
    for i in range(n):  # fill in place: peak memory stays ~ one layer above final
        p = (first if i == 0 else layers[i]).to_kind(kind)
        if kind == KIND_Q4:
            nib[i], zero[i] = p.nib, p.zero
        elif kind == KIND_Q8:
            q[i] = p.q
        else:
            w[i] = p.w
        if kind != KIND_F32:
            d[i], m[i] = p.d, p.m
    return (kind, nib, q, d, m, zero, w)


def stack_tiles(layers: Sequence[Packed], kind: int | None = None) -> tuple:
    """Per-layer matrices of one role -> TileStack with a leading layer axis (`kind`: as in
    stack)."""
    if kind is None:
        kind = common_kind([p.kind for p in layers],
                           {p.zero for p in layers if p.kind in NIBBLE_KINDS})
    n, first = len(layers), layers[0]
    tiles, nb = -(-first.rows // TILE_ROWS), first.cols // 32
    zero = np.zeros(n, np.int64)
    w = np.empty((n, 0, 0, 0), np.uint8)  # unused arrays stay indexable by layer
    d = m = np.empty((n, 0, 0, 0), np.uint16)
    wf = np.empty((n, 0, 0), np.float32)
    if kind == KIND_F32:
        wf = np.empty((n, first.rows, first.cols), np.float32)
    else:
        w = np.empty((n, tiles, nb, tile_bytes(kind)), np.uint8)
        d = np.empty((n, tiles, nb, TILE_ROWS), np.uint16)
        m = np.empty((n, tiles, nb, TILE_ROWS), np.uint16)
    any_m = False
    for i in range(n):  # fill in place: one layer's temporaries above the final
        p = (first if i == 0 else layers[i]).to_kind(kind)
        if kind == KIND_F32:
            wf[i] = p.w
            continue
        # a big matrix (a 262k-row embedding) in slices of whole tiles: to_tiles' copies stay
        # a slice's size, not three times the matrix's
        for r in range(0, p.rows, TILE_CHUNK):
            t = slice(r // TILE_ROWS, -(-min(r + TILE_CHUNK, p.rows) // TILE_ROWS))
            w[i, t], d[i, t], m[i, t] = to_tiles(row_slice(p, r, r + TILE_CHUNK))
        any_m = any_m or bool(np.any(m[i]))
        zero[i] = p.zero if kind in NIBBLE_KINDS else 128
    if kind != KIND_F32 and not any_m:  # no mins anywhere: the kernels skip m when it is empty
        m = np.empty((n, 0, 0, 0), np.uint16)
    if any_m and kind in NIBBLE_KINDS and np.any(zero):  # the kernels fold zero to 0 then
        raise ValueError(f"a {kind}-kind stack with mins has code offsets {sorted(set(zero))}")
    return (TileKind(kind, mins=any_m), zero, w, d, m, wf)


TILE_CHUNK = 256 * TILE_ROWS  # rows tiled at a time


def row_slice(p: Packed, start: int, stop: int) -> Packed:
    """Rows start..stop of a KIND_Q4 / KIND_Q5 / KIND_Q8 matrix (views, no copy)."""
    rows = slice(start, stop)
    return Packed(p.kind, len(range(p.rows)[rows]), p.cols,
                  nib=None if p.nib is None else p.nib[rows],
                  q=None if p.q is None else p.q[rows], d=p.d[rows], m=p.m[rows], zero=p.zero,
                  qh=None if p.qh is None else p.qh[rows])


class LazyLayers(Sequence[Packed]):
    """One role's per-layer matrices, unpacked from the file when indexed: stacking then holds
    one layer's temporaries at a time, not the whole role unpacked beside its stack."""

    def __init__(self, g: GGUFFile, names: list[tuple[str, ...]]) -> None:
        self.g, self.names = g, names  # per layer: the tensors merged into its rows

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> Packed:  # type: ignore[override]
        parts = [load_packed(self.g, name) for name in self.names[i]]
        # unpacked: the file's pages of this layer are not needed beside it
        self.g.release_pages()
        return parts[0] if len(parts) == 1 else concat_rows(parts)

    def subset(self, layers: Sequence[int]) -> LazyLayers:
        """These layers only, in this order."""
        return LazyLayers(self.g, [self.names[i] for i in layers])

    def kind(self, tiled: bool) -> int:
        """The kind stack / stack_tiles would pick from the unpacked layers, from the tensor
        types alone (quants.FORMATS): the widest, and 8 bits for 4- or 5-bit codes with
        different zeros merged into one matrix (concat_rows) or, in tiles, one stack."""
        formats = [[format_for(n, self.g.tensors[n].ggml_type, self.g.tensors[n].type_name)
                    for n in layer] for layer in self.names]
        kind = max((f.kind for layer in formats for f in layer), key=WIDTH.__getitem__)
        zeros = [{f.zero for f in layer if f.kind in NIBBLE_KINDS} for layer in formats]
        if kind in NIBBLE_KINDS and (any(len(z) > 1 for z in zeros) or
                                     (tiled and len(set().union(*zeros)) > 1)):
            kind = KIND_Q8
        return kind


K_QUANTS = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"})
ROLE_TENSORS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"),
                ("ffn_down",))


def q8k_roles(g: GGUFFile, config: ModelConfig) -> np.ndarray | None:
    """LlamaWeights.q8k: which projections take q8_K activations; None when none does, so
    that the step is compiled without the q8_K path (project_q8k.project_as)."""
    flags = np.zeros((5, config.n_layers), np.bool_)
    for r, role in enumerate(ROLE_TENSORS):
        for i in range(config.n_layers):
            flags[r, i] = all(g.tensors[f"blk.{i}.{t}.weight"].type_name in K_QUANTS
                              for t in role)
    head = "token_embd.weight" if config.tied_embeddings else "output.weight"
    flags[4, 0] = g.tensors[head].type_name in K_QUANTS
    return flags if flags.any() else None


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
    bqkv: np.ndarray  # (n_layers, (n_heads + 2 n_kv_heads) head_dim) f32; zeros without biases
    # (5, n_layers) bool, roles wqkv, wo, wgu, wdown, then the output head in [4, 0]: every
    # source tensor of the role is a K-quant, so its activations are quantized in q8_K blocks
    # of 256 (project_q8k.py) as llama.cpp does for those weight types — with one scale per
    # 256 values instead of per 32, which matters where activations are large (the first
    # token of qwen2.5-1.5b)
    q8k: np.ndarray | None  # (5, n_layers) bool: role r of layer i takes q8_K activations

    @classmethod
    def load(cls, g: GGUFFile, config: ModelConfig, tiled: bool = False) -> LlamaWeights:
        """Repack every tensor (as TileStacks when `tiled`); unsupported types raise
        UnsupportedModelError naming them."""
        stack_fn = stack_tiles if tiled else stack

        def stack_role(*roles: str, single: str | None = None) -> WeightStack:
            names = ([(single,)] if single else
                     [tuple(f"blk.{i}.{t}.weight" for t in roles) for i in layers])
            lazy = LazyLayers(g, names)
            if tiled and not single:  # layers of different kinds: split_stack.py
                s = split_tiles(lazy, stack_tiles)
            else:
                s = stack_fn(lazy, kind=lazy.kind(tiled))
            # this role's pages of the file are not read again: drop them now, so the mapped
            # copy never sits in memory beside the repacked one (peak ~ one role of the file)
            g.release_pages()
            return s

        for name in config.expected_tensors():  # fail fast, before any big copy
            info = g.tensors[name]
            format_for(name, info.ggml_type, info.type_name)

        def norm(name: str) -> np.ndarray:
            # a writable copy, like the stacked norms: a read-only view of the mapped file
            # would be another array type, and every kernel taking it would compile twice
            return np.array(g.array(name), dtype=np.float32).reshape(-1)

        layers = range(config.n_layers)
        blk = "blk.{}.{}.weight".format
        embd = stack_role(single="token_embd.weight")
        head = embd if config.tied_embeddings else stack_role(single="output.weight")
        qkv_cols = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim
        bqkv = np.zeros((config.n_layers, qkv_cols), np.float32)
        if config.qkv_bias:
            for i in layers:
                bqkv[i] = np.concatenate([norm(f"blk.{i}.{t}.bias")
                                          for t in ("attn_q", "attn_k", "attn_v")])
        return cls(
            embd=embd,
            head=head,
            out_norm=norm("output_norm.weight"),
            attn_norm=np.stack([norm(blk(i, "attn_norm")) for i in layers]),
            ffn_norm=np.stack([norm(blk(i, "ffn_norm")) for i in layers]),
            wqkv=stack_role("attn_q", "attn_k", "attn_v"),
            wo=stack_role("attn_output"),
            wgu=stack_role("ffn_gate", "ffn_up"),
            wdown=stack_role("ffn_down"),
            bqkv=bqkv,
            q8k=q8k_roles(g, config),
        )

    def nbytes(self) -> int:
        arrays = [self.out_norm, self.attn_norm, self.ffn_norm, self.bqkv]
        stacks = [self.embd, self.wqkv, self.wo, self.wgu, self.wdown]
        if self.head is not self.embd:
            stacks.append(self.head)
        return sum(a.nbytes for a in arrays) + sum(_stack_bytes(s) for s in stacks)


def _stack_bytes(s: tuple) -> int:
    """The arrays' bytes of a WeightStack, TileStack or SplitStack (split_stack.py)."""
    return sum(_stack_bytes(a) if isinstance(a, tuple) else a.nbytes
               for a in s if isinstance(a, tuple | np.ndarray))
