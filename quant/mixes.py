"""Which ggml type each tensor gets: llama.cpp's llama-quant.cpp rules for the file types we
support (no overrides): the 1-D/norm tensors that stay as they are, the output /
tied-embedding bump to Q6_K, the K-quant mixes (_S/_M/_L), and the fallback type for rows that
are not a multiple of the block size (SmolLM2's 576-wide rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T

# name -> (llama_ftype id, default tensor type); the _K aliases are llama-quantize's
FTYPES: dict[str, tuple[int, T]] = {
    "F32": (0, T.F32), "F16": (1, T.F16), "BF16": (32, T.BF16),
    "Q4_0": (2, T.Q4_0), "Q4_1": (3, T.Q4_1), "Q8_0": (7, T.Q8_0),
    "Q5_0": (8, T.Q5_0), "Q5_1": (9, T.Q5_1),
    "Q2_K": (10, T.Q2_K), "Q2_K_S": (21, T.Q2_K),
    "Q3_K_S": (11, T.Q3_K), "Q3_K_M": (12, T.Q3_K), "Q3_K_L": (13, T.Q3_K),
    "Q4_K_S": (14, T.Q4_K), "Q4_K_M": (15, T.Q4_K),
    "Q5_K_S": (16, T.Q5_K), "Q5_K_M": (17, T.Q5_K), "Q6_K": (18, T.Q6_K),
}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
_FLOAT_TYPES = (T.F32, T.F16, T.BF16)
# mixes llama.cpp quantizes only with an importance matrix (--imatrix)
NEEDS_IMATRIX = {"Q2_K_S"}

_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
          "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
          "indexer.k_proj.weight", "indexer.q_proj.weight", "attn_rel_b.weight",
          ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
          ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_TIME_MIX = re.compile(r"time_mix_(first|w[012]|v[012]|a[012]|g[12]|decay_w[12]|lerp_fused)"
                       r"\.weight")


def n_dims(shape: tuple[int, ...]) -> int:
    d = list(shape)
    while len(d) > 1 and d[-1] == 1:
        d.pop()
    return len(d)


def llama_order(names: list[str]) -> list[str]:
    """llama.cpp's weights_map order: by layer number (-1 for non-layer tensors), then name."""
    def key(name: str) -> tuple[int, bytes]:
        m = re.match(r"blk\.(-?\d+)\.", name)
        return (int(m.group(1)) if m else -1, name.encode())
    return sorted(names, key=key)


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if name in ("position_embd.weight", "token_types.weight") or _TIME_MIX.search(name):
        return False
    return not any(s in name for s in _NEVER)


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                     ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return "attn_qkv" if key == "attn_qkv.weight" else cat
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass(slots=True)
class MixState:
    """llama.cpp's quantize_state_impl, for one pass over the tensors in llama_order."""

    ftype: str
    n_layer: int
    n_gqa: int
    is_70b: bool = False
    tied_embeddings: bool = True
    n_attention_wv: int = 0
    counters: dict[str, int] = field(default_factory=lambda: {"attn_v": 0, "ffn_down": 0})
    n_fallback: int = 0
    has_imatrix: bool = False


def _mix_rule(st: MixState, new: T, name: str, shape: tuple[int, ...], cat: str) -> T:
    f = st.ftype
    if cat == "output" or (st.tied_embeddings and cat == "token_embd"):
        if shape[0] % GGML_QUANT_SIZES[new][0]:
            return T.Q8_0
        return new if new == T.Q8_0 else T.Q6_K
    if cat in ("attn_v", "attn_qkv"):
        i = st.counters["attn_v"]
        if f == "Q2_K":
            new = T.Q4_K if st.n_gqa >= 4 else T.Q3_K
        elif f == "Q2_K_S" and st.n_gqa >= 4:
            new = T.Q4_K
        elif f == "Q3_K_M":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif f == "Q3_K_L":
            new = T.Q5_K
        elif f in ("Q4_K_M", "Q5_K_M") and _more_bits(i, st.n_attention_wv):
            new = T.Q6_K
        elif f == "Q4_K_S" and i < 4:
            new = T.Q5_K
        if st.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K
        st.counters["attn_v"] += 1  # (llama.cpp's QKV-only rule is unreachable: attn_v wins)
    elif cat == "ffn_down":
        i, n = st.counters["ffn_down"], st.n_layer
        if f == "Q2_K":
            new = T.Q3_K
        elif f == "Q2_K_S":
            if i < n // 8:
                new = T.Q4_K
        elif f == "Q3_K_M":
            new = T.Q5_K if i < n // 16 else T.Q4_K
        elif f == "Q3_K_L":
            new = T.Q5_K
        elif f == "Q4_K_M":
            if _more_bits(i, n):
                new = T.Q6_K
        elif f == "Q5_K_M" and _more_bits(i, n):
            new = T.Q6_K
        elif f == "Q4_K_S" and i < n // 8:
            new = T.Q5_K
        elif f in ("Q4_0", "Q5_0") and st.has_imatrix and i < n // 8:
            new = T.Q4_1 if f == "Q4_0" else T.Q5_1  # llama.cpp's guard for early ffn_down
        st.counters["ffn_down"] += 1
    elif cat == "attn_output":
        new = {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(f, new)
    return new


_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def _fallback(st: MixState, new: T, ncols: int) -> T:
    block = GGML_QUANT_SIZES[new][0]
    if ncols % block == 0:
        return new
    st.n_fallback += 1
    out = _FALLBACK.get(new, new)
    return out if ncols % GGML_QUANT_SIZES[out][0] == 0 else T.F16


def plan_types(st: MixState, tensors: dict[str, tuple[tuple[int, ...], int]],
               pure: bool = False) -> dict[str, int]:
    """Target ggml type for every tensor (name -> (shape, current type)), in llama_order."""
    default = FTYPES[st.ftype][1]
    names = llama_order(list(tensors))
    st.tied_embeddings = "output.weight" not in tensors
    st.n_attention_wv = sum(category(n) in ("attn_v", "attn_qkv") for n in names)
    out: dict[str, int] = {}
    for name in names:
        shape, cur = tensors[name]
        if not allows_quantization(name, shape):
            out[name] = cur
            continue
        new = default
        if new not in _FLOAT_TYPES:
            if not pure:
                new = _mix_rule(st, new, name, shape, category(name))
            new = _fallback(st, new, shape[0])
        out[name] = int(new)
    return out
