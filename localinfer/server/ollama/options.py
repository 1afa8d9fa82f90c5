"""Ollama's `options`, `format` and `tools` mapped onto one generation's fields.

Sampling follows Ollama's rule: the request's options first, then the model's own settings
(the GGUF's `general.sampling.*`, which /api/show lists as `parameters`), then llama.cpp's
defaults (sampling_defaults.py, as `localinfer run` samples) — so a request that sets nothing
samples as Ollama would from the model's Modelfile, not greedily.

| option | SamplingParams |
|---|---|
| temperature, top_k, top_p, min_p, seed (-1: random), stop | the same |
| repeat_penalty, repeat_last_n (-1: the whole context) | repetition_penalty, penalty_last_n |
| presence_penalty, frequency_penalty | the same |
| num_predict (-1, -2: until the context ends) | max_tokens |
| num_ctx | checked: at most the server's context for the model (`--ctx`), else a 400 |

Other options (load-time ones such as num_gpu, num_thread, and the samplers we do not have:
mirostat, tfs_z, typical_p) are ignored, as Ollama ignores what its engine does not use.
`format` is "json" or a JSON Schema, enforced by structured output (constraints.py), as is
`tools` (the chat tool-call grammar). Errors name the Ollama field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from localinfer.sampling_defaults import SamplingDefaults
from localinfer.server.protocol import (
    GenerationFields,
    get_float,
    get_int,
    invalid,
    parse_generation,
)

# Ollama option -> SamplingParams field, for the knobs with a model default
_KNOBS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
          "repeat_penalty": "repetition_penalty", "repeat_last_n": "penalty_last_n"}
_UNTIL_CONTEXT_ENDS = (-1, -2)  # num_predict: -1 infinite, -2 fill the context


def generation_fields(body: dict[str, Any], llm: Any, max_model_len: int, model: str, *,
                      tools: bool) -> GenerationFields:
    """The request's fields (not streamed here: the route streams NDJSON itself)."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("options", "'options' must be an object")
    _check_num_ctx(options, max_model_len, model)
    openai: dict[str, Any] = {"stream": False}
    for name in ("temperature", "top_k", "top_p", "min_p", "presence_penalty",
                 "frequency_penalty", "stop"):
        if options.get(name) is not None:
            openai[name] = options[name]
    seed = get_int(options, "seed", -(2**63), 2**64 - 1, None)
    if seed is not None and seed != -1:  # -1: a random seed, as no seed
        openai["seed"] = seed
    num_predict = get_int(options, "num_predict", -2, 2**31, None)
    if num_predict == 0:
        raise invalid("num_predict", "'num_predict' must be at least 1, or -1 to generate "
                      "until the context ends")
    if num_predict is not None and num_predict not in _UNTIL_CONTEXT_ENDS:
        # more than the context: generation stops where the context ends ("length")
        openai["max_tokens"] = min(num_predict, max_model_len)
    fmt = format_constraint(body.get("format"))
    if fmt is not None:
        if tools and body.get("tools"):
            raise invalid("format", "'format' cannot be combined with 'tools'")
        openai["response_format"] = fmt
    if tools and body.get("tools") is not None:
        openai["tools"] = body["tools"]
    fields = parse_generation(openai, chat=True, max_model_len=max_model_len,
                              n_vocab=llm.tokenizer.n_vocab)
    if fields.constraints.param == "response_format":
        fields.constraints.param = "format"  # compile errors name the Ollama field
    fields.params = dataclasses.replace(fields.params, **_knobs(options, fields.params, llm))
    return fields


def format_constraint(fmt: Any) -> dict[str, Any] | None:
    """`format` as an OpenAI response_format: "json" any JSON object, a dict a JSON Schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise invalid("format", f"'format' must be \"json\" or a JSON Schema object, got {fmt!r}")


def _check_num_ctx(options: dict[str, Any], max_model_len: int, model: str) -> None:
    num_ctx = options.get("num_ctx")
    if num_ctx is None:
        return
    if isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or num_ctx < 1:
        raise invalid("num_ctx", f"'num_ctx' must be a positive integer, got {num_ctx!r}")
    if num_ctx > max_model_len:
        raise invalid("num_ctx", f"num_ctx {num_ctx} is more than the context this server "
                      f"gives model '{model}' ({max_model_len} tokens); ask for at most "
                      f"{max_model_len}, or restart the server with a larger --ctx")


def _knobs(options: dict[str, Any], params: Any, llm: Any) -> dict[str, Any]:
    """Each sampling knob: the option if given (parse_generation checked the ones sharing
    OpenAI's name; the other two are checked here), else the model's default."""
    defaults = SamplingDefaults.from_metadata(llm.gguf.metadata).values
    out: dict[str, Any] = {}
    for option, field in _KNOBS.items():
        if options.get(option) is None:
            out[field] = defaults[field]
        elif option == "repeat_penalty":
            out[field] = get_float(options, option, 1e-3, 10.0, 1.0)
        elif option == "repeat_last_n":
            out[field] = get_int(options, option, -1, 1 << 20, 64)
        else:
            out[field] = getattr(params, field)
    return out
