"""Build GGUF files byte by byte for tests: valid tiny llama models and hostile variants.

The low-level helpers (gguf_string, kv, tensor_info, build_gguf) pack exactly what they are given,
so tests can craft any malformed header; write_tiny_llama() writes a small but complete llama
model (byte-level BPE vocab, chat template, F32 / F16 / Q8_0 / Q4_1 weights).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType, GGUFValueType

# the packers are the GGUF fuzzer's (localinfer/fuzz/gguf_encode.py), under the names tests use
from localinfer.fuzz.gguf_encode import kv, tensor_info  # noqa: F401  (re-exported)
from localinfer.fuzz.gguf_encode import nbytes as nbytes_of
from localinfer.fuzz.gguf_encode import string as gguf_string  # noqa: F401  (re-exported)
from localinfer.fuzz.gguf_encode import value as value_bytes  # noqa: F401  (re-exported)

VT = GGUFValueType
QT = GGMLQuantizationType

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order (row length first)
    ggml_type: int = QT.F32
    data: bytes | None = None  # default: deterministic bytes of the right size
    offset: int | None = None  # data-section offset; default: packed in order, aligned


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def build_gguf(kvs: Sequence[bytes | tuple], tensors: Sequence[TensorSpec] = (), *,
               magic: bytes = b"GGUF", version: int = 3, n_tensors: int | None = None,
               n_kv: int | None = None, alignment: int = 32) -> bytes:
    """Pack a GGUF file. kvs items are raw bytes or (key, vtype, value[, etype]) tuples.

    n_tensors / n_kv override the header counts; alignment must match any general.alignment
    among kvs (it decides where the data section starts). Like gguf.GGUFWriter, every tensor
    (the last one too) is padded to the alignment.
    """
    kv_blob = b"".join(item if isinstance(item, bytes) else kv(*item) for item in kvs)
    offsets, pos = [], 0
    for t in tensors:
        offsets.append(pos if t.offset is None else t.offset)
        pos = _align(offsets[-1] + nbytes_of(t.shape, t.ggml_type), alignment)
    info_blob = b"".join(tensor_info(t.name, t.shape, t.ggml_type, off)
                         for t, off in zip(tensors, offsets, strict=True))
    header = magic + struct.pack("<IQQ", version,
                                 len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    out = bytearray(header + kv_blob + info_blob)
    if not tensors:
        return bytes(out)
    data_start = _align(len(out), alignment)
    out += bytes(data_start - len(out))
    for t, off in zip(tensors, offsets, strict=True):
        size = nbytes_of(t.shape, t.ggml_type)
        data = t.data if t.data is not None else bytes((i * 7 + 3) & 0xFF for i in range(size))
        end = data_start + off + len(data)
        if len(out) < end:
            out += bytes(end - len(out))
        out[data_start + off:end] = data
    out += bytes(_align(len(out) - data_start, alignment) + data_start - len(out))
    return bytes(out)


def tiny_vocab(words: Sequence[str] = ("the", "and", "hello", "world", "ing")
               ) -> tuple[list[str], list[int], list[str]]:
    """A GPT-2 style byte-level BPE vocab: 3 specials, the 256 byte symbols, then merges that
    spell each word and its 'Ġ'-prefixed form. Returns (tokens, token_types, merges)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + byte_symbols()
    types = [3] * len(specials) + [1] * 256
    merges: list[str] = []
    known = set(tokens)
    for word in words:
        for form in ("Ġ" + word, word):
            left = form[0]
            for ch in form[1:]:
                merged = left + ch
                if merged not in known:
                    merges.append(f"{left} {ch}")
                    tokens.append(merged)
                    types.append(1)
                    known.add(merged)
                left = merged
    return tokens, types, merges


def byte_symbols() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others map to
    U+0100 upwards in byte order. Index b is the symbol of byte b."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def _weight(rng: np.random.Generator, shape: tuple[int, ...], ggml_type: int,
            scale: float = 0.02) -> bytes:
    values = (rng.standard_normal(tuple(reversed(shape))) * scale).astype(np.float32)
    if ggml_type == QT.F32:
        return values.tobytes()
    if ggml_type == QT.F16:
        return values.astype(np.float16).tobytes()
    return quants.quantize(values, QT(ggml_type)).tobytes()


def tiny_llama_parts(*, n_layers: int = 2, n_embd: int = 64, n_heads: int = 4,
                     n_kv_heads: int = 2, n_ff: int = 128, n_ctx: int = 256,
                     weight_type: int = QT.F32, embd_type: int | None = None,
                     tied: bool = True, seed: int = 0, extra_kvs: Sequence[tuple] = (),
                     chat_template: str | None = CHATML_TEMPLATE
                     ) -> tuple[list[tuple], list[TensorSpec]]:
    """The KV tuples and tensors of a tiny llama model (see write_tiny_llama)."""
    tokens, types, merges = tiny_vocab()
    n_vocab = len(tokens)
    head_dim = n_embd // n_heads
    kvs: list[tuple] = [
        ("general.architecture", VT.STRING, "llama"),
        ("general.name", VT.STRING, "tiny-llama-test"),
        ("llama.block_count", VT.UINT32, n_layers),
        ("llama.context_length", VT.UINT32, n_ctx),
        ("llama.embedding_length", VT.UINT32, n_embd),
        ("llama.feed_forward_length", VT.UINT32, n_ff),
        ("llama.attention.head_count", VT.UINT32, n_heads),
        ("llama.attention.head_count_kv", VT.UINT32, n_kv_heads),
        ("llama.rope.freq_base", VT.FLOAT32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-5),
        ("llama.rope.dimension_count", VT.UINT32, head_dim),
        ("llama.vocab_size", VT.UINT32, n_vocab),
        ("tokenizer.ggml.model", VT.STRING, "gpt2"),
        ("tokenizer.ggml.pre", VT.STRING, "smollm"),
        ("tokenizer.ggml.tokens", VT.ARRAY, tokens, VT.STRING),
        ("tokenizer.ggml.token_type", VT.ARRAY, types, VT.INT32),
        ("tokenizer.ggml.merges", VT.ARRAY, merges, VT.STRING),
        ("tokenizer.ggml.bos_token_id", VT.UINT32, 1),
        ("tokenizer.ggml.eos_token_id", VT.UINT32, 2),
        ("tokenizer.ggml.add_bos_token", VT.BOOL, False),
    ]
    if chat_template is not None:
        kvs.append(("tokenizer.chat_template", VT.STRING, chat_template))
    kvs.extend(extra_kvs)

    rng = np.random.default_rng(seed)
    kv_dim = n_kv_heads * head_dim
    embd_type = weight_type if embd_type is None else embd_type
    shapes: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (n_embd, n_vocab), embd_type)]
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (n_embd,), QT.F32),
            (p + "attn_q.weight", (n_embd, n_embd), weight_type),
            (p + "attn_k.weight", (n_embd, kv_dim), weight_type),
            (p + "attn_v.weight", (n_embd, kv_dim), weight_type),
            (p + "attn_output.weight", (n_embd, n_embd), weight_type),
            (p + "ffn_norm.weight", (n_embd,), QT.F32),
            (p + "ffn_gate.weight", (n_embd, n_ff), weight_type),
            (p + "ffn_up.weight", (n_embd, n_ff), weight_type),
            (p + "ffn_down.weight", (n_ff, n_embd), weight_type),
        ]
    shapes.append(("output_norm.weight", (n_embd,), QT.F32))
    if not tied:
        shapes.append(("output.weight", (n_embd, n_vocab), weight_type))
    tensors = []
    for name, shape, qtype in shapes:
        if name.endswith("norm.weight"):
            data = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32).tobytes()
        else:
            data = _weight(rng, shape, qtype)
        tensors.append(TensorSpec(name, shape, qtype, data))
    return kvs, tensors


def write_tiny_llama(path: str | Path, **kwargs: Any) -> Path:
    """Write a small valid llama GGUF (by default 2 layers, n_embd 64, 4 heads, 2 KV heads,
    n_ff 128, ~300-token byte-level BPE vocab, ChatML template, F32 weights) to path;
    kwargs go to tiny_llama_parts (weight_type=QT.Q4_1, embd_type=QT.Q8_0, tied=False, ...)."""
    kvs, tensors = tiny_llama_parts(**kwargs)
    path = Path(path)
    path.write_bytes(build_gguf(kvs, tensors))
    return path


def write_tiny_gemma3(path: str | Path, *, window: int = 32, n_layers: int = 4,
                      pattern: int = 2, scale: float = 8.0, seed: int = 0) -> Path:
    """A tiny gemma3 (the tiny llama's shapes, head_dim 16, plus per-head Q/K norms and the
    post-attention / post-FFN norms): layers alternate sliding-window (window tokens) and
    global attention (every pattern-th is global). Matrices are scaled by `scale` so sampled
    continuations vary from token to token."""
    kvs, tensors = tiny_llama_parts(n_layers=n_layers, n_ctx=4096, seed=seed)
    kvs = [("general.architecture", VT.STRING, "gemma3") if kv[0] == "general.architecture"
           else ("gemma3." + kv[0][6:], *kv[1:]) if kv[0].startswith("llama.") else kv
           for kv in kvs]
    kvs += [("gemma3.attention.sliding_window", VT.UINT32, window),
            ("gemma3.attention.sliding_window_pattern", VT.UINT32, pattern)]
    tensors = [t if t.name.endswith("norm.weight") else
               TensorSpec(t.name, t.shape, t.ggml_type,
                          (np.frombuffer(t.data, np.float32) * scale).tobytes())
               for t in tensors]
    rng = np.random.default_rng(seed + 1)
    head_dim = 16  # tiny_llama_parts: n_embd 64 over 4 heads
    for i in range(n_layers):
        for name, n in (("attn_q_norm", head_dim), ("attn_k_norm", head_dim),
                        ("post_attention_norm", 64), ("post_ffw_norm", 64)):
            data = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).tobytes()
            tensors.append(TensorSpec(f"blk.{i}.{name}.weight", (n,), QT.F32, data))
    path = Path(path)
    path.write_bytes(build_gguf(kvs, tensors))
    return path
