"""TurnStats: what one reply cost — TTFT, decode speed, context and prefix-cache use."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localinfer.engine.outputs import RequestOutput


@dataclass(slots=True)
class TurnStats:
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_output_tokens: int = 0
    ttft_s: float | None = None
    decode_tps: float | None = None  # as the tokens reached the UI
    visible_tps: float | None = None  # as they went on screen (ReplyBuffer.visible_tps)
    finish_reason: str | None = None

    def update(self, out: RequestOutput, now: float | None = None) -> None:
        """Fold in one streamed output (its times are time.perf_counter() values)."""
        now = time.perf_counter() if now is None else now
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.num_output_tokens = out.num_output_tokens
        if out.first_token_time is not None:
            self.ttft_s = out.first_token_time - out.arrival_time
            if self.num_output_tokens > 1 and now > out.first_token_time:
                self.decode_tps = (self.num_output_tokens - 1) / (now - out.first_token_time)
        if out.finished:
            self.finish_reason = out.finish_reason

    @property
    def context_used(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def summary(self) -> str:
        ttft = f"{self.ttft_s * 1000:.0f} ms" if self.ttft_s is not None else "-"
        tps = f"{self.decode_tps:.1f} tok/s" if self.decode_tps is not None else "-"
        return (
            f"TTFT {ttft}, decode {tps}, prompt {self.num_prompt_tokens} tokens "
            f"({self.num_cached_tokens} from the prefix cache, {self.prefix_hit_rate:.0%}), "
            f"reply {self.num_output_tokens} tokens"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
