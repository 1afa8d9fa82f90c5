"""RequestOutput (one streamed delta of one request) and EngineStats (a snapshot)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(slots=True)
class TokenLogprob:
    """Log-probabilities of one generated token under the model (before sampling filters)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens, most likely first


@dataclass(slots=True)
class RequestOutput:
    seq_id: int
    request_id: str
    text: str  # new text since the previous output of this request
    token_ids: list[int]  # new token ids since the previous output
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int  # all output tokens so far
    arrival_time: float  # time.perf_counter() at add_request
    first_token_time: float | None
    prompt_logits: np.ndarray | None = None  # (n_prompt, n_vocab) float32, when asked for
    logprobs: list[TokenLogprob] | None = None  # one per token in token_ids, when asked for
    # params.prompt_logprobs: prompt tokens 1.. (the first has no context to be scored in),
    # on the request's first output with tokens
    prompt_logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # why the request failed alone (finish_reason "abort")


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    block_size: int
    prefix_cache_hit_tokens: int
    prefix_cache_queried_tokens: int
    prompt_tokens_total: int  # prompt tokens of all requests added
    generation_tokens_total: int  # tokens sampled
    num_preemptions: int
    # prompt tokens of unfinished requests not computed yet: the prefill work ahead of a
    # request admitted now (EngineLoop's max_prefill_backlog bounds it)
    prefill_backlog_tokens: int = 0
    # speculative decoding: guessed tokens verified, those accepted, and verifications
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verifications: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed speculative tokens."""
        n = self.spec_proposed_tokens
        return self.spec_accepted_tokens / n if n else 0.0

    @property
    def spec_mean_accepted(self) -> float:
        """Guesses accepted per verification (each also yields one token of the target's)."""
        n = self.spec_verifications
        return self.spec_accepted_tokens / n if n else 0.0

    def spec_summary(self) -> str:
        return (f"speculative: {self.spec_accepted_tokens}/{self.spec_proposed_tokens} guessed "
                f"tokens accepted ({self.spec_acceptance_rate:.0%}), "
                f"{self.spec_mean_accepted:.2f} per verification over "
                f"{self.spec_verifications} verifications")
