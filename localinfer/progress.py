"""A small progress bar for long work (downloads, loading, compiling), drawn on stderr.

It draws only when stderr is a terminal unless forced, so logs and pipes stay clean; with
`plain_every` a stream that is not a terminal gets a plain line that often instead (no carriage
returns in a log file). unit="s" shows elapsed time against an expected duration.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

# on_update(label, done, total): lets a UI (the TUI's model picker) draw its own bar
ProgressCallback = Callable[[str, int, "int | None"], None]


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class ProgressBar:
    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        unit: str = "bytes",
        on_update: ProgressCallback | None = None,
        plain_every: float | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        tty = self.stream.isatty()
        self.enabled = tty if enabled is None else enabled
        # a log or a pipe: whole lines, seldom (None: nothing until close)
        self.plain_every = plain_every if enabled is None and not tty else None
        self.total = total
        self.label = label
        self.unit = unit
        self.on_update = on_update
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_plain = self._start
        self._width = 0  # of the line drawn last: a shorter one must blank the rest
        self._done_at_start = 0  # restart(): the rate counts this phase's units only

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            if self.enabled:
                self._draw(now)
            elif self.plain_every is not None and now - self._last_plain >= self.plain_every:
                self._last_plain = now
                self.stream.write(self.text(now) + "\n")
                self.stream.flush()
            if self.on_update is not None:
                self.on_update(self.label, self.done, self.total)

    def restart(self, label: str, total: int | None, done: int = 0) -> None:
        """A new phase on the same line (download, then unpack): its own count and rate."""
        self.label, self.total, self.done = label, total, done
        self._start = time.monotonic()
        self._done_at_start = done
        self._last_draw = 0.0  # a new phase is drawn at once
        self.update(0)

    def _fmt(self, n: float) -> str:
        if self.unit == "bytes":
            return human_bytes(n)
        return f"{n:.0f} s" if self.unit == "s" else f"{n:.0f}"

    def text(self, now: float | None = None, columns: int = 120) -> str:
        """The bar as one line of text (no carriage return), its bar narrowed to fit
        `columns`."""
        now = time.monotonic() if now is None else now
        rate = (self.done - self._done_at_start) / max(now - self._start, 1e-6)
        speed = (f" {human_bytes(rate)}/s" if self.unit == "bytes"
                 else "" if self.unit == "s" else f" {rate:.0f} {self.unit}/s")
        if not self.total:
            return f"{self.label} {self._fmt(self.done)}{speed}"
        frac = min(self.done / self.total, 1.0)
        # an expected duration is a guess: "~"
        total = ("~" if self.unit == "s" else "") + self._fmt(self.total)
        figures = f"{frac * 100:5.1f}% {self._fmt(self.done)}/{total}{speed}"
        width = min(30, columns - len(self.label) - len(figures) - 3)
        if width < 5:  # no room for a bar: the figures matter more
            return f"{self.label} {figures}"
        fill = int(frac * width)
        return f"{self.label} {'█' * fill}{'·' * (width - fill)} {figures}"

    def _draw(self, now: float) -> None:
        self._line(self.text(now, self._columns()))

    @staticmethod
    def _columns() -> int:
        return max(20, shutil.get_terminal_size((120, 24)).columns - 1)

    def _line(self, line: str) -> None:
        # a line wider than the terminal wraps, and each redraw would then leave a line behind
        line = line[: self._columns()]
        pad = " " * max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write(f"\r{line}{pad}")
        self.stream.flush()

    def close(self, message: str | None = None) -> None:
        """End the display; `message` (e.g. "done in 3 s") replaces the bar's last state."""
        if self.on_update is not None:
            self.on_update(self.label, self.done, self.total)
        if self.enabled:
            if message is not None:
                self._line(message)
            else:
                self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False
        elif message is not None and self.plain_every is not None:
            self.stream.write(message + "\n")
            self.stream.flush()
        self.plain_every = None
