"""`localinfer info MODEL`: what a GGUF file holds and roughly how much memory running it takes.

Works for any architecture the file declares (it reads `{arch}.*` keys directly rather than going
through ModelConfig, which only accepts architectures a backend can run).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.engine.config import DEFAULT_MAX_MODEL_LEN
from localinfer.gguf_file import open_gguf
from localinfer.gguf_strings import StringArray

DEFAULT_POOL_SEQS = 2  # EngineConfig's default KV pool holds two full-length sequences
STEP_TOKENS = 512  # EngineConfig.max_num_batched_tokens
STEP_LOGITS = 16  # EngineConfig.max_num_seqs: rows of logits per decode step


@dataclass(frozen=True, slots=True)
class TypeStats:
    count: int
    nbytes: int
    n_elements: int


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: Path
    file_size: int
    gguf_version: int
    architecture: str
    name: str | None
    n_params: int  # sum of tensor elements (a tied embedding counts once)
    n_tensors: int
    tensor_types: dict[str, TypeStats]  # type name -> stats, most bytes first
    context_length: int | None  # trained context
    n_layers: int | None
    n_embd: int | None
    n_heads: int | None
    n_kv_heads: int | None  # the largest, when it varies per layer
    head_dim: int | None
    n_ff: int | None
    n_vocab: int | None
    tokenizer_model: str | None
    has_chat_template: bool
    weights_bytes: int  # mapped, not copied: pages are loaded as they are used
    n_ctx: int | None  # context used for the KV estimate
    kv_cache_bytes: int  # f16 K and V for DEFAULT_POOL_SEQS sequences of n_ctx tokens
    compute_bytes: int  # activations of one step, rough
    notes: list[str] = field(default_factory=list)

    @property
    def backends(self) -> list[str]:
        return runnable_backends(self.architecture)

    @property
    def memory_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.size:
        return int(value.max())  # per-layer values (e.g. head_count_kv in some architectures)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _per_layer_kv_heads(meta: dict[str, Any], key: str, n_layers: int) -> list[int]:
    value = meta.get(key)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and len(value) == n_layers:
        return [int(v) for v in value]
    one = _int(meta, key)
    return [one or 0] * n_layers


def describe(path: str | Path, n_ctx: int | None = None) -> ModelInfo:
    """Open and validate the file (GGUFError if it is malformed) and summarize it."""
    with open_gguf(path) as g:
        meta, arch = g.metadata, g.arch
        stats: dict[str, list[int]] = {}
        for t in g.tensors.values():
            s = stats.setdefault(t.type_name, [0, 0, 0])
            s[0] += 1
            s[1] += t.nbytes
            s[2] += t.n_elements
        types = {k: TypeStats(*v) for k, v in sorted(stats.items(), key=lambda kv: -kv[1][1])}

        def key(name: str) -> int | None:
            return _int(meta, f"{arch}.{name}")

        n_layers, n_embd, n_heads = key("block_count"), key("embedding_length"), key(
            "attention.head_count")
        head_dim = key("attention.key_length") or (
            n_embd // n_heads if n_embd and n_heads else None)
        v_dim = key("attention.value_length") or head_dim
        tokens = meta.get("tokenizer.ggml.tokens")
        embd = g.tensors.get("token_embd.weight")
        n_vocab = len(tokens) if isinstance(tokens, StringArray) else (
            embd.shape[1] if embd is not None and len(embd.shape) == 2 else key("vocab_size"))
        ctx_train = key("context_length")
        notes: list[str] = []
        if n_ctx is None and ctx_train:
            n_ctx = min(ctx_train, DEFAULT_MAX_MODEL_LEN)
        kv_bytes = 0
        if n_layers and head_dim and n_ctx:
            kv_heads = _per_layer_kv_heads(meta, f"{arch}.attention.head_count_kv", n_layers)
            if not any(kv_heads):
                kv_heads = [n_heads or 0] * n_layers
            per_token = sum(h * (head_dim + (v_dim or head_dim)) * 2 for h in kv_heads)
            kv_bytes = per_token * n_ctx * DEFAULT_POOL_SEQS
        else:
            notes.append("KV cache size unknown (missing layer/head metadata)")
        n_ff = key("feed_forward_length")
        compute = 0
        if n_embd:
            # one step of STEP_TOKENS tokens: residual, norm, q/k/v/o and three FFN activations
            # in float32, plus float32 logits for STEP_LOGITS sequences
            compute = 4 * STEP_TOKENS * (6 * n_embd + 3 * (n_ff or 4 * n_embd))
            compute += 4 * STEP_LOGITS * (n_vocab or 0)
        name = meta.get("general.name")
        template = meta.get("tokenizer.chat_template")
        tok_model = meta.get("tokenizer.ggml.model")
        return ModelInfo(
            path=g.path, file_size=g.file_size, gguf_version=g.version, architecture=arch,
            name=name if isinstance(name, str) else None,
            n_params=sum(s.n_elements for s in types.values()), n_tensors=len(g.tensors),
            tensor_types=types, context_length=ctx_train, n_layers=n_layers, n_embd=n_embd,
            n_heads=n_heads, n_kv_heads=key("attention.head_count_kv") or n_heads,
            head_dim=head_dim, n_ff=n_ff, n_vocab=n_vocab,
            tokenizer_model=tok_model if isinstance(tok_model, str) else None,
            has_chat_template=isinstance(template, str) and bool(template.strip()),
            weights_bytes=sum(s.nbytes for s in types.values()), n_ctx=n_ctx,
            kv_cache_bytes=kv_bytes, compute_bytes=compute, notes=notes,
        )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _opt(value: object) -> str:
    return "?" if value is None else str(value)


def runnable_backends(arch: str) -> list[str]:
    """Backends that can run this architecture here (without importing any of them)."""
    from localinfer.model_config import SUPPORTED_ARCHITECTURES

    found = ["numba"] if arch in SUPPORTED_ARCHITECTURES else []
    if importlib.util.find_spec("llama_cpp") is not None:  # any architecture llama.cpp knows
        found.append("llamacpp")
    else:
        found.append("llamacpp (not installed: pip install 'localinfer[llamacpp]')")
    if arch in SUPPORTED_ARCHITECTURES:
        from localinfer.backends.triton_cuda.device import describe

        found.append(describe())  # the GPU it would use, or why there is none
    return found


def format_info(info: ModelInfo) -> str:
    types = ", ".join(f"{k} {s.count} ({_size(s.nbytes)})" for k, s in info.tensor_types.items())
    heads = f"{_opt(info.n_heads)} ({_opt(info.n_kv_heads)} KV)"
    rows = [
        ("model", f"{info.name or info.path.stem} ({info.architecture})"),
        ("file", f"{info.path} ({_size(info.file_size)}, GGUF v{info.gguf_version})"),
        ("parameters", f"{_count(info.n_params)} ({info.n_params:,})"),
        ("tensors", f"{info.n_tensors}: {types}"),
        ("context", f"{_opt(info.context_length)} tokens (trained)"),
        ("layers", f"{_opt(info.n_layers)}; embedding {_opt(info.n_embd)}; heads {heads}; "
                   f"head dim {_opt(info.head_dim)}; feed-forward {_opt(info.n_ff)}"),
        ("vocabulary", f"{_opt(info.n_vocab)} tokens ({info.tokenizer_model or 'no'} tokenizer)"),
        ("chat template", "yes" if info.has_chat_template else "no"),
        ("backends", ", ".join(info.backends)),
        ("memory", f"~{_size(info.memory_bytes)}: weights {_size(info.weights_bytes)} (mapped)"
                   f" + KV cache {_size(info.kv_cache_bytes)} (f16, {DEFAULT_POOL_SEQS} x "
                   f"{_opt(info.n_ctx)} tokens) + compute ~{_size(info.compute_bytes)}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"{'note':<{width}}  {n}" for n in info.notes]
    return "\n".join(lines)
