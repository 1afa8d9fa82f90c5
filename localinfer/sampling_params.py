"""SamplingParams: what a request asks of the sampler and of the stop logic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localinfer.errors import InvalidRequestError
from localinfer.structured.spec import StructuredOutput

MAX_LOGPROBS = 20  # as the OpenAI API caps top_logprobs
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # llama.cpp-style: divides positive logits of seen tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # how many recent tokens the penalties look at (-1: all)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's and the top k
    # None: none; k: every prompt token's logprob (the first has none) and the top k of each
    prompt_logprobs: int | None = None
    # token id -> added to its logit before anything else (OpenAI's logit_bias); -100 bans a
    # token in practice, +100 all but forces it
    logit_bias: dict[int, float] | None = None
    # constrain the output (JSON Schema, regex, grammar, choice): token masks, engine-side
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        def bad(param: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"invalid {param}: {why}")

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool):
            raise bad("max_tokens", "must be an integer")
        if self.max_tokens < 1:
            raise bad("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0.0:
            raise bad("temperature", f"must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise bad("top_k", f"must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool)
        ):
            raise bad("seed", "must be an integer")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise bad("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}]")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int)
            or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise bad("prompt_logprobs", f"must be an integer in [0, {MAX_LOGPROBS}]")
        if self.logit_bias is not None:
            self._validate_logit_bias(bad)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "stop strings must be non-empty strings")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise bad("structured", "must be a StructuredOutput")

    def _validate_logit_bias(self, bad: Callable[[str, str], InvalidRequestError]) -> None:
        if not isinstance(self.logit_bias, dict):
            raise bad("logit_bias", "must be a dict of token id -> bias")
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise bad("logit_bias", f"token id {token!r} is not a non-negative integer")
            if (isinstance(bias, bool) or not isinstance(bias, (int, float))
                    or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise bad("logit_bias", f"bias {bias!r} of token {token} is not a number in "
                          f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
