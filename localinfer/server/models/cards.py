"""ModelCard: what the Ollama model routes say about a GGUF file, read from its header.

`details` (format, family, parameter size, quantization), `model_info` (the GGUF's general.*
and architecture keys, scalars only, as Ollama shows them), the chat template, the sampling
defaults written as Ollama `parameters` text, and `capabilities` ("completion"; "tools" when
the chat template renders tools; "insert" when the vocabulary has fill-in-the-middle tokens).
Reading a header is cheap; the digest of a file given by path is hashed once and remembered
(file_digest.py). Blocking: call from a worker thread.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.server.models.served import ServedModel

FIM_TOKENS = ({"<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<PRE>", "<|prefix|>"},
              {"<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<SUF>", "<|suffix|>"})
_SCALARS = (str, int, float, bool)
_OLLAMA_PARAMETERS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repeat_penalty",
                      "general.sampling.penalty_last_n": "repeat_last_n"}


@dataclass(frozen=True, slots=True)
class ModelCard:
    digest: str
    size: int
    modified_at: str
    details: dict[str, Any]
    model_info: dict[str, Any]
    template: str
    parameters: str
    capabilities: list[str]


def card_for(model: ServedModel, path: Path) -> ModelCard:
    from localinfer.gguf_file import open_gguf
    from localinfer.model_info import describe

    info = describe(path)
    st = path.stat()
    modified = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).astimezone()
    with open_gguf(path) as gguf:
        meta = gguf.metadata
        model_info = {k: (v if isinstance(v, _SCALARS) else None) for k, v in meta.items()
                      if k.startswith(("general.", f"{info.architecture}."))}
        # Ollama lists the tokenizer's arrays as null; their sizes are what a client can use
        model_info["tokenizer.ggml.model"] = meta.get("tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = set(tokens) if tokens is not None else set()
        template = meta.get("tokenizer.chat_template")
        parameters = _parameters(meta)
    model_info["general.parameter_count"] = info.n_params
    template = template if isinstance(template, str) else ""
    capabilities = ["completion"]
    if "tools" in template:
        capabilities.append("tools")
    if all(vocab & texts for texts in FIM_TOKENS):
        capabilities.append("insert")
    quant = next(iter(info.tensor_types), "unknown")  # the type holding the most bytes
    details = {"parent_model": "", "format": "gguf", "family": info.architecture,
               "families": [info.architecture], "parameter_size": _params(info.n_params),
               "quantization_level": quant}
    return ModelCard(digest=_digest(model, path), size=st.st_size,
                     modified_at=modified.isoformat(), details=details, model_info=model_info,
                     template=template, parameters=parameters, capabilities=capabilities)


def _params(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + unit
    return str(n)


def _digest(model: ServedModel, path: Path) -> str:
    if model.entry is not None:  # the catalog pins it; the pull verified it
        return model.entry.sha256
    from localinfer import paths
    from localinfer.file_digest import file_digest

    return file_digest(path, paths.weight_cache_dir() / "digests")[0]


def _parameters(meta: dict[str, Any]) -> str:
    """The sampling settings the model's author recorded (general.sampling.*), one
    `name value` line each under Ollama's parameter names, as a Modelfile's lines read."""
    lines = [f"{name:<16}{meta[key]}" for key, name in _OLLAMA_PARAMETERS.items() if key in meta]
    return "\n".join(lines)
