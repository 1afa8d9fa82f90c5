"""`localinfer bench chat`: the chat's visible decode rate against the engine's, one model.

Each repetition first streams the prompt the way `localinfer run --stats` does (LLM.stream on
this thread, nothing else running; its decode tok/s is the reference), then types the same
prompt into the real chat app, headless at a realistic terminal size, with the engine on its
own thread as in `localinfer chat`. Greedy sampling and the same token limit, so both sides
generate the same tokens. Reported: the engine's rate, the chat's rate as tokens reached the UI
and as they went on screen (tokens shown after the first frame / seconds from the first frame to
the last), and visible / engine. The headless driver does the layout and rendering but writes
no escape codes to a terminal, so a terminal emulator's own cost is not in these numbers.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localinfer.errors import LocalInferError

PROMPT = "Tell me a long story about a dragon and a knight."
SIZE = (120, 40)  # columns, rows


@dataclass(slots=True)
class ChatBench:
    model: str
    backend: str
    threads: int
    isa: str
    tokens: int  # the limit; each row says how many were generated
    size: tuple[int, int] = SIZE
    rows: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        values = [r[key] for r in self.rows if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    def ratio(self) -> float:
        return self.median("visible_tps") / self.median("engine_tps")

    def table(self) -> str:
        n = len(self.rows)
        lines = [
            f"localinfer bench chat: {Path(self.model).name}, {self.backend} backend, "
            f"{self.threads} threads, ISA {self.isa}, {self.tokens} tokens, "
            f"{self.size[0]}x{self.size[1]} terminal, medians of {n} run(s)",
            f"  engine (as localinfer run)  {self.median('engine_tps'):8.1f} tok/s",
            f"  chat, reaching the UI       {self.median('received_tps'):8.1f} tok/s",
            f"  chat, visible               {self.median('visible_tps'):8.1f} tok/s"
            f"  ({self.median('frames'):.0f} frames)",
            f"  visible / engine            {self.ratio():8.2f}",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio()}


def run(model: str | None, tokens: int, reps: int, threads: int | None, backend: str,
        backend_options: dict[str, Any] | None,
        show: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> ChatBench:
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    show("loading the model")
    llm = LLM(model, backend=backend, threads=threads, backend_options=backend_options,
              progress=True)
    try:
        llm.generate("Hi", SamplingParams(max_tokens=2))  # compile / load the kernels first
        runner = llm.engine.runner
        bench = ChatBench(str(llm.path), backend, int(getattr(runner, "threads", 0) or 0),
                          str(getattr(runner, "isa", "-")), tokens)
        for rep in range(reps):
            show(f"run {rep + 1}/{reps}: engine")
            engine_tps, n_engine = _engine(llm, tokens)
            show(f"run {rep + 1}/{reps}: chat")
            row = _chat(llm, tokens)
            if row["tokens"] != n_engine:
                show(f"note: the chat generated {row['tokens']} tokens, the engine {n_engine}")
            bench.rows.append({"engine_tps": engine_tps, "engine_tokens": n_engine, **row})
    finally:
        llm.close()
    return bench


def _engine(llm: Any, tokens: int) -> tuple[float, int]:
    """`localinfer run --stats`'s decode figure: LLM.stream on this thread."""
    from localinfer.llm import GenerationResult
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    result = GenerationResult()
    start = time.perf_counter()
    for out in llm.stream(llm.request(PROMPT), params):
        result.add(out, start)
    return result.decode_tps, len(result.token_ids)


def _chat(llm: Any, tokens: int) -> dict[str, Any]:
    """One reply in the real app under Textual's pilot, the engine on its own thread."""
    from localinfer.tui.app import ChatApp
    from localinfer.tui.conversation import ChatSettings, Conversation
    from localinfer.tui.session import ChatSession, LoadOptions

    # a session per run: its engine thread must not be alive while _engine steps the engine
    session = ChatSession(llm, Path(llm.path).stem)
    conv = Conversation(settings=ChatSettings(temperature=0.0, max_tokens=tokens))
    app = ChatApp(LoadOptions(), conv, None, session=session)

    async def drive() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press(*PROMPT, "enter")
            while app.chat.generations == 0:  # not pilot.pause: it repaints the screen
                await asyncio.sleep(0.05)

    try:
        asyncio.run(drive())
    finally:
        session.loop.shutdown(drain_timeout=0.0)
    turn, reply = app.chat.last_turn, app.chat.reply
    if turn is None or reply is None or turn.finish_reason in (None, "error", "abort"):
        raise LocalInferError("bench chat: the chat produced no reply")
    return {"tokens": turn.num_output_tokens, "received_tps": turn.decode_tps,
            "visible_tps": reply.visible_tps, "frames": reply.frames}
