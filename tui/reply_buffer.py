"""ReplyBuffer: streamed reply text waiting for the next frame, and when that frame is due.

The engine thread hands over every token as it is sampled (without waking the UI: the chat
reads them when wake_at() says, engine_loop.RequestHandle.batch); showing each one costs the UI a
Markdown update, a layout pass and a repaint, and on a machine whose cores all run kernels that
UI time (and the GIL it holds) is taken from the engine. So the UI gathers tokens here and
shows them in frames, paced by its own CPU use: a frame that cost more pushes the next one
further away, which keeps the UI within BUDGET of one core (never faster than MIN_FRAME_S,
never slower than MAX_FRAME_S, so the text still visibly streams). The first token and the
end of the reply are shown at once. No Textual here: the pacing is plain arithmetic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.engine.outputs import RequestOutput

BUDGET = 0.04  # share of one core the UI may spend on showing the stream
MIN_FRAME_S = 1 / 30  # Textual repaints at most 60 times a second; text needs no more than 30
MAX_FRAME_S = 0.25  # slower than this no longer looks like streaming
SMOOTHING = 0.3  # weight of the newest frame's cost in the running estimate


class ReplyBuffer:
    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        """`cpu_clock` must measure the UI thread alone (time.thread_time, called on it)."""
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._pending: list[str] = []
        self.token_ids: list[int] = []  # every token taken in, shown or pending
        self.num_shown = 0  # tokens on screen
        self.frozen = False  # stopped: later tokens are not taken in
        self.frames = 0
        self.first_shown: float | None = None  # clock() when the first token went on screen
        self.last_shown: float | None = None
        self._first_count = 0  # tokens in the first frame (their time is the TTFT's)
        self._frame_cost = 0.0  # running estimate of a frame's UI CPU seconds
        self._cpu_mark = cpu_clock()
        self._next_frame = 0.0  # clock() before which no frame is due

    def add(self, out: RequestOutput) -> bool:
        """Take in one streamed output; False (and nothing taken) once frozen."""
        if self.frozen:
            return False
        self.token_ids.extend(out.token_ids)
        if out.text:
            self._pending.append(out.text)
        return True

    def freeze(self) -> None:
        """The user stopped the reply: what was taken in so far is all it will hold."""
        self.frozen = True
        self._next_frame = 0.0  # show the rest at once

    @property
    def pending(self) -> bool:
        return bool(self._pending) or self.num_shown < len(self.token_ids)

    def due(self) -> bool:
        return self.pending and self._clock() >= self._next_frame

    def take(self) -> str:
        """The text to show in this frame (everything pending); call shown() once it is."""
        text = "".join(self._pending)
        self._pending.clear()
        return text

    def shown(self) -> None:
        """The frame is on screen: note the time and schedule the next frame from what the
        UI thread spent since the previous one (this frame, its layout and repaint, and
        taking in the tokens)."""
        now = self._clock()
        self.num_shown = len(self.token_ids)
        self.frames += 1
        cpu = self._cpu_clock()
        cost, self._cpu_mark = cpu - self._cpu_mark, cpu
        if self.first_shown is None:  # its cost is mostly the reply's setup, not a frame's
            self.first_shown, self._first_count = now, self.num_shown
        else:
            self._frame_cost += SMOOTHING * (cost - self._frame_cost)
        self.last_shown = now
        wait = min(MAX_FRAME_S, max(MIN_FRAME_S, self._frame_cost / BUDGET))
        self._next_frame = now + wait

    def wake_at(self) -> float | None:
        """When the reader should next look for tokens: the next frame's clock() time while
        one is scheduled ahead, else None (wake for the next token as it comes)."""
        return self._next_frame if self._clock() < self._next_frame else None

    @property
    def visible_tps(self) -> float | None:
        """Tokens shown per second of streaming: after the first shown token, to the last."""
        if self.first_shown is None or self.last_shown is None:
            return None
        span = self.last_shown - self.first_shown
        return (self.num_shown - self._first_count) / span if span > 0 else None
