"""SamplingDefaults: how `run` and `chat` sample when the user sets nothing.

A model's author may record recommended settings in the GGUF (llama.cpp's `general.sampling.*`
keys, written from the model's generation_config.json); a key missing from the file takes
llama.cpp's default (common/common.h, common_params_sampling), so a model samples here as it
does under llama-cli. Greedy decoding is not the default on purpose: a small model decoded
greedily falls into loops ("la France, la France, …"). Each explicit flag overrides its key
alone; `temperature=0` asks for greedy. The server keeps the OpenAI API's semantics and does
not use these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localinfer.errors import GGUFError, InvalidRequestError
from localinfer.sampling_params import SamplingParams

# SamplingParams field -> (GGUF key, llama.cpp's default, type)
KEYS: dict[str, tuple[str, float | int, type]] = {
    "temperature": ("general.sampling.temp", 0.8, float),
    "top_k": ("general.sampling.top_k", 40, int),
    "top_p": ("general.sampling.top_p", 0.95, float),
    "min_p": ("general.sampling.min_p", 0.05, float),
    "repetition_penalty": ("general.sampling.penalty_repeat", 1.0, float),
    "penalty_last_n": ("general.sampling.penalty_last_n", 64, int),
}
# keys our sampler has no stage for: reported, not applied (sequence: we apply penalties,
# top-k, top-p, min-p, temperature in llama.cpp's default order)
UNSUPPORTED = ("general.sampling.sequence", "general.sampling.xtc_probability",
               "general.sampling.xtc_threshold", "general.sampling.mirostat",
               "general.sampling.mirostat_tau", "general.sampling.mirostat_eta")
SHORT = {"temperature": "temp", "repetition_penalty": "repeat_penalty"}


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    values: dict[str, float | int]  # one per KEYS field
    from_model: frozenset[str] = frozenset()  # fields the GGUF set
    ignored: tuple[str, ...] = ()  # UNSUPPORTED keys the GGUF set

    @classmethod
    def llama_cpp(cls) -> SamplingDefaults:
        return cls({name: default for name, (_, default, _) in KEYS.items()})

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> SamplingDefaults:
        values: dict[str, float | int] = {}
        from_model = set()
        for name, (key, default, kind) in KEYS.items():
            value = meta.get(key)
            if value is None:
                values[name] = default
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    kind is int and value != int(value)) or not math.isfinite(value):
                raise GGUFError(f"metadata {key} must be a finite {kind.__name__}, "
                                f"got {value!r}")
            values[name] = kind(value)
            from_model.add(name)
        try:  # a value out of range is the file's fault, not the user's
            SamplingParams(**values)  # type: ignore[arg-type]
        except InvalidRequestError as exc:
            raise GGUFError(f"the model's recommended sampling settings: {exc}") from None
        ignored = tuple(k for k in UNSUPPORTED if k in meta)
        return cls(values, frozenset(from_model), ignored)

    def params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams with these values, each replaced by an override that is not None
        (explicit flags); other SamplingParams fields (max_tokens, seed, stop, …) pass as is."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return SamplingParams(**{**self.values, **given})  # type: ignore[arg-type]

    def describe(self, params: SamplingParams, explicit: Mapping[str, Any] | None = None, *,
                 seed: bool = True) -> str:
        """One line: the effective settings and where each came from ("set": a flag or the
        chat's settings; "model": the GGUF; "llama.cpp": its default)."""
        explicit = explicit or {}
        if params.greedy:
            parts = ["greedy (temperature 0)"]
            names = [n for n in ("repetition_penalty",) if params.repetition_penalty != 1.0]
        else:
            parts, names = [], list(KEYS)
            if params.repetition_penalty == 1.0:  # the window matters only with a penalty
                names.remove("penalty_last_n")
        for name in names:
            value = getattr(params, name)
            source = ("set" if explicit.get(name) is not None
                      else "model" if name in self.from_model else "llama.cpp")
            parts.append(f"{SHORT.get(name, name)} {value:g} ({source})")
        line = "sampling: " + ", ".join(parts)
        if seed and not params.greedy:
            line += f", seed {params.seed if params.seed is not None else 'random'}"
        if self.ignored:
            line += f"; not supported, ignored: {', '.join(self.ignored)}"
        return line
