"""Sequence: one request's tokens, its KV blocks and its progress through the scheduler."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from localinfer.engine.adaptive_k import AdaptiveK
from localinfer.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()  # holds no KV blocks (new, or preempted for recompute)
    RUNNING = enum.auto()  # holds KV blocks for all its tokens; prefilling or decoding
    FINISHED_STOPPED = enum.auto()  # EOG token, stop token id or stop string
    FINISHED_LENGTH = enum.auto()  # max_tokens or the context limit
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    SequenceStatus.FINISHED_STOPPED,
    SequenceStatus.FINISHED_LENGTH,
    SequenceStatus.FINISHED_ABORTED,
}
FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]  # prompt then output; the last one is not in the KV cache yet
    sampling_params: SamplingParams
    num_prompt_tokens: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, taken from the prefix cache at the last allocation
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    prompt_logits: bool = False  # return logits of every prompt position (score())
    prompt_logits_rows: list[Any] = field(default_factory=list)  # np rows, filled by the engine
    # params.prompt_logprobs: TokenLogprobs of prompt tokens 1.. (row p scores token p + 1),
    # filled chunk by chunk and handed out once, with the first sampled token
    prompt_logprobs: list[Any] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    generator: Any = None  # numpy Generator of this request (seeded if params.seed is set)
    guide: Any = None  # structured.Guide: the grammar matcher of a constrained request
    # speculative decoding: this step's guesses, scheduled after the last token (never in
    # token_ids until verified), and how many the sequence may guess (engine/adaptive_k.py)
    spec_token_ids: list[int] = field(default_factory=list)
    adaptive_k: AdaptiveK | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def wants_prompt_rows(self) -> bool:
        """Every prompt position's logits row is needed (score(), or prompt logprobs not yet
        handed out), so no position may come from the prefix cache."""
        return self.prompt_logits or (self.sampling_params.prompt_logprobs is not None
                                      and not self.prompt_logprobs_sent)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
