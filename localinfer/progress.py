"""A small progress bar for long work (downloads, loading), drawn on stderr.

It draws only when stderr is a terminal unless forced, so logs and pipes stay clean.
"""

from __future__ import annotations

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
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total
        self.label = label
        self.unit = unit
        self.on_update = on_update
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = 0.0

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
            if self.on_update is not None:
                self.on_update(self.label, self.done, self.total)

    def _fmt(self, n: float) -> str:
        return human_bytes(n) if self.unit == "bytes" else f"{n:.0f}"

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self._start, 1e-6)
        speed = f"{human_bytes(rate)}/s" if self.unit == "bytes" else f"{rate:.0f} {self.unit}/s"
        if self.total:
            frac = min(self.done / self.total, 1.0)
            width = 30
            fill = int(frac * width)
            bar = "█" * fill + "·" * (width - fill)
            line = (
                f"\r{self.label} {bar} {frac * 100:5.1f}% "
                f"{self._fmt(self.done)}/{self._fmt(self.total)} {speed}"
            )
        else:
            line = f"\r{self.label} {self._fmt(self.done)} {speed}"
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.on_update is not None:
            self.on_update(self.label, self.done, self.total)
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False
