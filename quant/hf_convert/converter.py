"""Convert a Hugging Face model directory (config.json, *.safetensors, tokenizer.json or Gemma 3's
tokenizer.model, tokenizer_config.json) of the llama, qwen2 or gemma3 family into a GGUF file,
as llama.cpp's convert_hf_to_gguf.py does with its default output type: 2-D weights stay F16 /
BF16 (F32 ones become F16), norms and biases are F32, llama's Q/K rows are permuted, Gemma 3's
norm weights get their +1, and the tokenizer metadata and chat template come along. Written
crash-safely like the quantizer's output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.constants import GGUFValueType as V

from localinfer.errors import GGUFError, UnsupportedModelError

from ..gguf_writer import KV, GGUFStreamWriter, TensorSpec
from .gemma3 import gemma3_hparam_kvs, hf_text_name, norm_shift
from .safetensors import SafetensorsFile
from .tensor_map import IGNORED, gguf_name, permute_qk
from .tokenizer_json import tokenizer_kvs
from .tokenizer_spm import spm_tokenizer_kvs

ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
         "Qwen2ForCausalLM": "qwen2", "Gemma3ForCausalLM": "gemma3",
         "Gemma3ForConditionalGeneration": "gemma3"}


def is_hf_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _config(folder: Path) -> tuple[str, dict[str, Any]]:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnsupportedModelError(f"{folder}: no config.json (not a Hugging Face model "
                                    "directory)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{folder}/config.json: invalid JSON: {exc}") from None
    names = cfg.get("architectures") or []
    for n in names:
        if n in ARCHS:
            if isinstance(cfg.get("text_config"), dict):  # multimodal: the language model's
                cfg = {**cfg, **cfg["text_config"]}
            return ARCHS[n], cfg
    raise UnsupportedModelError(f"{folder}: architecture {names or '?'} is not supported "
                                f"(supported: {', '.join(sorted(ARCHS))})")


def _hparam_kvs(arch: str, cfg: dict[str, Any], folder: Path, ftype: int) -> list[KV]:
    try:
        n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        kvs = [
            KV("general.architecture", V.STRING, arch),
            KV("general.type", V.STRING, "model"),
            KV("general.name", V.STRING, folder.resolve().name),
            KV(f"{arch}.block_count", V.UINT32, int(cfg["num_hidden_layers"])),
            KV(f"{arch}.context_length", V.UINT32, int(cfg.get("max_position_embeddings",
                                                             2048))),
            KV(f"{arch}.embedding_length", V.UINT32, n_embd),
            KV(f"{arch}.feed_forward_length", V.UINT32, int(cfg["intermediate_size"])),
            KV(f"{arch}.attention.head_count", V.UINT32, n_head),
            KV(f"{arch}.attention.head_count_kv", V.UINT32,
               int(cfg.get("num_key_value_heads") or n_head)),
            KV(f"{arch}.rope.freq_base", V.FLOAT32, float(cfg.get("rope_theta", 10000.0))),
            KV(f"{arch}.attention.layer_norm_rms_epsilon", V.FLOAT32,
               float(cfg.get("rms_norm_eps", 1e-6))),
            KV("general.file_type", V.UINT32, ftype),
        ]
        if arch == "gemma3":
            return gemma3_hparam_kvs(cfg, kvs)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"{folder}/config.json: missing or invalid {exc}") from None
    if arch == "llama":
        head_dim = int(cfg.get("head_dim") or n_embd // n_head)
        kvs += [KV("llama.vocab_size", V.UINT32, int(cfg.get("vocab_size", 0))),
                KV("llama.rope.dimension_count", V.UINT32, head_dim)]
    return kvs


def _open_shards(folder: Path) -> dict[str, SafetensorsFile]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{folder}: no *.safetensors files")
    where: dict[str, SafetensorsFile] = {}
    for f in files:
        st = SafetensorsFile(f)
        for name in st.tensors:
            where[name] = st
    return where


def convert_hf_dir(folder: str | Path, dst: str | Path,
                   warn: Callable[[str], None] | None = None) -> Path:
    """Write the GGUF of a Hugging Face directory to dst; returns dst."""
    from localinfer.atomic_file import atomic_write
    from localinfer.gguf_file import open_gguf

    folder, dst = Path(folder), Path(dst)
    warn = warn or (lambda m: print(f"localinfer: warning: {m}", file=sys.stderr))
    arch, cfg = _config(folder)
    where = _open_shards(folder)
    try:
        n_head = int(cfg["num_attention_heads"])
        n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"{folder}/config.json: missing or invalid {exc}") from None
    tied = bool(cfg.get("tie_word_embeddings", False)) or "lm_head.weight" not in where
    plan: list[tuple[str, str]] = []  # (hf name, gguf name)
    for hf in where:
        text_name = hf_text_name(hf) if arch == "gemma3" else hf
        if text_name is None:  # vision tower / projector of a multimodal checkpoint
            continue
        name = gguf_name(text_name, arch)
        if name is None:
            if IGNORED.fullmatch(hf):
                continue
            raise UnsupportedModelError(f"{folder}: unexpected tensor {hf!r} for {arch}")
        if name == "output.weight" and tied:
            continue
        plan.append((hf, name))
    plan.sort(key=lambda p: _order(p[1]))
    dtypes = {where[hf].dtype(hf) for hf, _ in plan if len(where[hf].tensors[hf][1]) == 2}
    out_t = T.BF16 if dtypes == {"BF16"} else T.F16
    ftype = 32 if out_t == T.BF16 else 1
    kvs = _hparam_kvs(arch, cfg, folder, ftype)
    vocab_size = int(cfg.get("vocab_size") or 0) or None
    if arch == "gemma3" and (folder / "tokenizer.model").is_file():
        kvs += spm_tokenizer_kvs(folder, cfg, vocab_size)
    else:
        kvs += tokenizer_kvs(folder, vocab_size, arch, warn)
    n_vocab = len(next(kv.value for kv in kvs if kv.key == "tokenizer.ggml.tokens"))
    kvs.append(KV("general.quantization_version", V.UINT32, 2))
    specs = []
    for hf, name in plan:
        shape = where[hf].tensors[hf][1]
        if arch == "gemma3" and name == "token_embd.weight":  # rows past the vocabulary go
            shape = (min(shape[0], n_vocab), *shape[1:])
        specs.append(TensorSpec(name, tuple(reversed(shape)), out_t if len(shape) == 2
                                else T.F32))
    with atomic_write(dst, validate=lambda p: open_gguf(p).close()) as f:
        w = GGUFStreamWriter(f, kvs, specs)
        for (hf, name), spec in zip(plan, specs, strict=True):
            arr = _convert(where[hf], hf, name, spec.ggml_type, arch, n_head, n_head_kv)
            w.write_tensor(name, arr[:spec.shape[-1]] if name == "token_embd.weight" else arr)
        w.finish()
    return dst


def _order(name: str) -> tuple[int, int, str]:
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name == "token_embd.weight" else 2, 0, name)


def _to_f32(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def _convert(st: SafetensorsFile, hf: str, name: str, out_t: int, arch: str, n_head: int,
             n_head_kv: int) -> np.ndarray:
    arr, dtype = st.array(hf), st.dtype(hf)
    if dtype not in ("F32", "F16", "BF16"):
        raise GGUFError(f"{st.path}: tensor {hf} has dtype {dtype}, expected a float type")
    if arch == "gemma3" and norm_shift(hf):
        # Gemma's RMSNorm scales by (1 + w); llama.cpp adds the 1 in the source precision
        # (F16 stays F16, BF16 is widened to F32 first), as convert_hf_to_gguf.py does
        arr = arr + np.float16(1) if dtype == "F16" else _to_f32(arr, dtype) + np.float32(1)
        dtype = "F16" if dtype == "F16" else "F32"
    if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
        arr = permute_qk(arr, n_head if "attn_q" in name else n_head_kv)
    if out_t == T.F32:
        return _to_f32(arr, dtype)
    if out_t == T.BF16:
        return arr  # BF16 source bits, unchanged
    if dtype == "F16":
        return arr
    return _to_f32(arr, dtype).astype(np.float16)
