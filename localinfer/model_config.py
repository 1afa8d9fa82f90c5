"""ModelConfig: the hyperparameters a backend needs, read from GGUF metadata and checked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.errors import GGUFError, UnsupportedModelError
from localinfer.gguf_checks import check_vocab

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ff: int
    rope_base: float
    rope_dim: int
    rms_eps: float
    tied_embeddings: bool  # no output.weight: the token embedding doubles as the output head
    # --- gemma3 (defaults leave llama / qwen2 unchanged) ---
    sliding_window: int = 0  # keys a sliding-window layer sees, the query's own included
    swa_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window (local) attention
    rope_base_swa: float = 10000.0  # rope base of the sliding-window layers
    rope_freq_scale: float = 1.0  # linear rope scaling of the global layers (1 / factor)
    attn_scale: float = 0.0  # Q scale before attention; 0 = 1 / sqrt(head_dim)
    final_logit_softcap: float = 0.0  # logits = c * tanh(logits / c) when > 0

    @classmethod
    def from_gguf(cls, g: GGUFFile, strict_arch: bool = True) -> ModelConfig:
        """strict_arch=False accepts any architecture (for runners such as llama.cpp that
        know more of them); the generic metadata and vocabulary checks still apply."""
        meta = g.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{g.path}: missing general.architecture")
        if strict_arch and arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

        def num(key: str, default: Any = None, kind: type = int) -> Any:
            full = f"{arch}.{key}"
            value = meta.get(full, default)
            if value is None:
                raise GGUFError(f"{g.path}: missing metadata key {full}")
            # Integer fields must be stored as integers; float fields must be finite.
            allowed = (int,) if kind is int else (int, float)
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise GGUFError(f"{g.path}: metadata {full} must be a number, got {value!r}")
            if kind is float and not math.isfinite(value):
                raise GGUFError(f"{g.path}: metadata {full} = {value} is not finite")
            return kind(value)

        n_embd = num("embedding_length")
        n_heads = num("attention.head_count")
        n_kv_heads = num("attention.head_count_kv", n_heads)
        n_layers = num("block_count")
        n_ff = num("feed_forward_length")
        n_ctx = num("context_length")
        for name, value, hi in (
            ("embedding_length", n_embd, 1 << 20),
            ("attention.head_count", n_heads, 1 << 12),
            ("attention.head_count_kv", n_kv_heads, 1 << 12),
            ("block_count", n_layers, 1 << 12),
            ("feed_forward_length", n_ff, 1 << 22),
            ("context_length", n_ctx, 1 << 24),
        ):
            if not 0 < value <= hi:
                raise GGUFError(f"{g.path}: {arch}.{name} = {value} is out of range")
        key_length = meta.get(f"{arch}.attention.key_length")
        if (key_length is None and n_embd % n_heads) or n_heads % n_kv_heads:
            raise GGUFError(
                f"{g.path}: inconsistent heads: embedding {n_embd}, heads {n_heads}, "
                f"kv heads {n_kv_heads}"
            )
        head_dim = n_embd // n_heads if key_length is None else num("attention.key_length")
        if num("attention.value_length", head_dim) != head_dim or not 0 < head_dim <= 1 << 12:
            raise UnsupportedModelError(f"{arch}: key/value head sizes differ or are out of range")
        rope_dim = num("rope.dimension_count", head_dim)
        if not 0 < rope_dim <= head_dim or rope_dim % 2:
            raise GGUFError(f"{g.path}: rope dimension {rope_dim} invalid for head_dim {head_dim}")

        embd = g.tensors.get("token_embd.weight")
        if embd is None:
            raise GGUFError(f"{g.path}: missing tensor token_embd.weight")
        if len(embd.shape) != 2 or embd.shape[0] != n_embd:
            raise GGUFError(f"{g.path}: token_embd.weight has shape {embd.shape}, expected "
                            f"({n_embd}, n_vocab)")
        n_vocab = embd.shape[1]
        # tokens / scores / token_type lengths and types, special token ids < n_vocab
        check_vocab(g, n_vocab)
        rope_base = num("rope.freq_base", 10000.0, float)
        rms_eps = num("attention.layer_norm_rms_epsilon", 1e-5, float)
        if rope_base <= 0 or not 0 < rms_eps < 1:
            raise GGUFError(f"{g.path}: rope base {rope_base} / rms epsilon {rms_eps} invalid")
        return cls(
            arch=arch,
            n_vocab=n_vocab,
            n_ctx_train=n_ctx,
            n_embd=n_embd,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            n_ff=n_ff,
            rope_base=rope_base,
            rope_dim=rope_dim,
            rms_eps=rms_eps,
            tied_embeddings="output.weight" not in g.tensors,
            **(_gemma3_fields(meta, num, n_layers, n_embd, n_heads, head_dim, g.path)
               if arch == "gemma3" else {}),
        )

    @property
    def qkv_bias(self) -> bool:
        """qwen2 adds a bias after each of the Q, K and V projections."""
        return self.arch == "qwen2"

    @property
    def rope_neox(self) -> bool:
        """qwen2 rotates pairs (i, i + rope_dim / 2) (ggml's NEOX rope); llama adjacent pairs."""
        return self.arch == "qwen2"

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the architecture (llama, or qwen2 = llama + Q/K/V biases) needs, with
        its ggml-order shape."""
        e, kv = self.n_embd, self.n_kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (e, self.n_vocab),
            "output_norm.weight": (e,),
        }
        if not self.tied_embeddings:
            shapes["output.weight"] = (e, self.n_vocab)
        for i in range(self.n_layers):
            p = f"blk.{i}."
            shapes |= {
                p + "attn_norm.weight": (e,),
                p + "attn_q.weight": (e, self.n_heads * self.head_dim),
                p + "attn_k.weight": (e, kv),
                p + "attn_v.weight": (e, kv),
                p + "attn_output.weight": (self.n_heads * self.head_dim, e),
                p + "ffn_norm.weight": (e,),
                p + "ffn_gate.weight": (e, self.n_ff),
                p + "ffn_up.weight": (e, self.n_ff),
                p + "ffn_down.weight": (self.n_ff, e),
            }
            if self.qkv_bias:
                shapes |= {p + "attn_q.bias": (self.n_heads * self.head_dim,),
                           p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)}
            if self.arch == "gemma3":  # per-head Q/K norms, norms after attention and FFN
                shapes |= {p + "attn_q_norm.weight": (self.head_dim,),
                           p + "attn_k_norm.weight": (self.head_dim,),
                           p + "post_attention_norm.weight": (e,),
                           p + "post_ffw_norm.weight": (e,)}
        return shapes

    def check_tensors(self, g: GGUFFile) -> None:
        for name, shape in self.expected_tensors().items():
            info = g.tensors.get(name)
            if info is None:
                raise GGUFError(f"{g.path}: missing tensor {name} required by {self.arch}")
            if tuple(info.shape) != shape:
                raise GGUFError(
                    f"{g.path}: tensor {name} has shape {tuple(info.shape)}, expected {shape}"
                )


# --- gemma3 -------------------------------------------------------------------------------------
def _gemma3_fields(meta: dict[str, Any], num: Any, n_layers: int, n_embd: int, n_heads: int,
                   head_dim: int, path: Any) -> dict[str, Any]:
    """Sliding-window layout, rope bases and scales as llama.cpp reads them for gemma3."""
    window = num("attention.sliding_window", 0)
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if window <= 0:
        swa = (False,) * n_layers
    elif isinstance(pattern, list):  # an explicit per-layer flag list
        if len(pattern) != n_layers:
            raise GGUFError(f"{path}: sliding_window_pattern has {len(pattern)} entries, "
                            f"expected {n_layers}")
        swa = tuple(bool(v) for v in pattern)
    else:  # every pattern-th layer (the last of each group) is global; 0 = all local
        n = num("attention.sliding_window_pattern", 6)
        swa = tuple(n == 0 or i % n < n - 1 for i in range(n_layers))
    factor = num("rope.scaling.factor", 0.0, float)
    scaling = meta.get("gemma3.rope.scaling.type", "linear")
    if factor not in (0.0, 1.0) and scaling not in ("linear", "none"):
        raise UnsupportedModelError(f"gemma3: rope scaling {scaling!r} is not supported")
    # gemma's query_pre_attn_scalar: n_embd / n_heads for the 27B (62 layers), else head_dim
    # (llama.cpp hard-codes the same rule; the GGUF carries no key for it)
    q_dim = n_embd // n_heads if n_layers == 62 else head_dim
    return {
        "sliding_window": max(window, 0),
        "swa_layers": swa,
        "rope_base_swa": num("rope.freq_base_swa", 10000.0, float),
        "rope_freq_scale": 1.0 if factor == 0.0 else 1.0 / factor,
        "attn_scale": 1.0 / math.sqrt(q_dim),
        "final_logit_softcap": num("final_logit_softcapping", 0.0, float),
    }
