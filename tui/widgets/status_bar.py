"""StatusBar: the engine at work — TTFT, decode speed, context, KV blocks, prefix-cache hits,
and speculative decoding's acceptance once it has verified guesses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

if TYPE_CHECKING:
    from localinfer.tui.turn_stats import TurnStats

    from localinfer.engine.outputs import EngineStats

SEP = " │ "


class StatusBar(Static):
    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.model = ""
        self.state = "starting"
        self.limit = 0
        self.context_used = 0
        self.turn: TurnStats | None = None
        self.engine: EngineStats | None = None
        self.warning = ""

    def set(self, **fields: object) -> None:
        for name, value in fields.items():
            setattr(self, name, value)
        self.update(self.render_text())

    def render_text(self) -> Text:
        turn, engine = self.turn, self.engine
        text = Text()
        text.append(f" {self.model or '-'} ", style="bold")
        text.append(f"{self.state}", style="italic")
        ttft = f"{turn.ttft_s * 1000:.0f} ms" if turn and turn.ttft_s is not None else "-"
        tps = f"{turn.decode_tps:.1f}" if turn and turn.decode_tps is not None else "-"
        text.append(f"{SEP}TTFT {ttft}{SEP}{tps} tok/s")
        text.append(f"{SEP}ctx {self.context_used}/{self.limit or '-'}")
        if engine is not None:
            text.append(f"{SEP}KV {engine.kv_blocks_used}/{engine.kv_blocks_total} blocks")
        hit = f"{turn.prefix_hit_rate:.0%}" if turn and turn.num_prompt_tokens else "-"
        text.append(f"{SEP}prefix hit {hit}")
        if engine is not None and engine.spec_verifications:
            text.append(f"{SEP}spec {engine.spec_acceptance_rate:.0%} "
                        f"({engine.spec_mean_accepted:.1f}/step)")
        if self.warning:
            text.append(f"{SEP}⚠ {self.warning}", style="bold yellow")
        return text
