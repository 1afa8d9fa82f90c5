"""Gemma 3 specifics of the conversion, after llama.cpp's Gemma3Model converter: the
hyperparameters it writes (its defaults where config.json leaves them out, Q/K head size,
sliding window, the global and local rope bases, linear/YaRN rope scaling, final logit
soft-capping), the multimodal checkpoint's language-model tensor names, and which tensors are
RMSNorm weights stored as (w - 1)."""

from __future__ import annotations

from typing import Any

from gguf.constants import GGUFValueType as V

from localinfer.errors import UnsupportedModelError

from ..gguf_writer import KV

_SKIP = ("vision_tower", "vision_model", "multi_modal_projector", "projector.")


def hf_text_name(hf: str) -> str | None:
    """The text model's tensor name (Gemma3ForConditionalGeneration nests it under
    language_model), or None for the vision tower and projector."""
    if any(s in hf for s in _SKIP):
        return None
    return hf.replace("language_model.", "")


def norm_shift(hf: str) -> bool:
    return hf.endswith("norm.weight")  # every Gemma3RMSNorm: layers, q/k norms, final norm


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """HF's rope_parameters (transformers >= 5: per attention type) or the older flat
    rope_scaling / rope_theta / rope_local_base_freq, in the former's shape."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "full_attention" not in rope and "sliding_attention" not in rope:
        if cfg.get("rope_local_base_freq") is not None:
            rope["sliding_attention"] = {"rope_theta": cfg["rope_local_base_freq"]}
        if "rope_theta" not in rope and cfg.get("rope_theta") is not None:
            rope["rope_theta"] = cfg["rope_theta"]
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
    return rope


def gemma3_hparam_kvs(cfg: dict[str, Any], common: list[KV]) -> list[KV]:
    """common: the general.* keys and the shared hyperparameters; gemma3's values replace them
    where the converter's defaults differ."""
    a = "gemma3"
    if cfg.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError("gemma3: attn_logit_softcapping is not part of Gemma 3")
    rope = _rope_parameters(cfg)
    full = rope.get("full_attention", rope)
    head_dim = int(cfg.get("head_dim", 256))
    own = {
        f"{a}.context_length": KV(f"{a}.context_length", V.UINT32,
                                  int(cfg.get("max_position_embeddings", 131072))),
        f"{a}.attention.head_count": KV(f"{a}.attention.head_count", V.UINT32,
                                        int(cfg.get("num_attention_heads", 8))),
        f"{a}.attention.head_count_kv": KV(f"{a}.attention.head_count_kv", V.UINT32,
                                           int(cfg.get("num_key_value_heads", 4))),
        f"{a}.attention.layer_norm_rms_epsilon": KV(
            f"{a}.attention.layer_norm_rms_epsilon", V.FLOAT32, float(cfg.get("rms_norm_eps",
                                                                             1e-6))),
        f"{a}.rope.freq_base": KV(f"{a}.rope.freq_base", V.FLOAT32,
                                  float(full.get("rope_theta", 1_000_000.0))),
    }
    kvs = [own.pop(kv.key, kv) for kv in common]
    kvs += list(own.values())
    kvs += [KV(f"{a}.attention.key_length", V.UINT32, head_dim),
            KV(f"{a}.attention.value_length", V.UINT32, head_dim)]
    swa = rope.get("sliding_attention", {}).get("rope_theta")
    if swa is not None:
        kvs.append(KV(f"{a}.rope.freq_base_swa", V.FLOAT32, float(swa)))
    if cfg.get("final_logit_softcapping"):
        kvs.append(KV(f"{a}.final_logit_softcapping", V.FLOAT32,
                      float(cfg["final_logit_softcapping"])))
    if cfg.get("sliding_window_pattern") != 1:
        kvs.append(KV(f"{a}.attention.sliding_window", V.UINT32, int(cfg["sliding_window"])))
    kind, factor = full.get("rope_type"), full.get("factor")
    if kind == "linear" and factor is not None:
        kvs += [KV(f"{a}.rope.scaling.type", V.STRING, "linear"),
                KV(f"{a}.rope.scaling.factor", V.FLOAT32, float(factor))]
    elif kind == "yarn" and factor is not None:
        kvs += [KV(f"{a}.rope.scaling.type", V.STRING, "yarn"),
                KV(f"{a}.rope.scaling.factor", V.FLOAT32, float(factor)),
                KV(f"{a}.rope.scaling.original_context_length", V.UINT32,
                   int(full["original_max_position_embeddings"]))]
    return kvs
