"""Which stage the bench is in, on stderr: one updating line on a terminal, else plain lines."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Stage:
    def __init__(self, prefix: str = "", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.prefix = prefix
        self._start = time.monotonic()

    def show(self, text: str) -> None:
        line = f"{self.prefix}{text}"
        if self.tty:
            self.stream.write(f"\r\x1b[K{line}")
        else:
            self.stream.write(f"{line}\n")
        self.stream.flush()

    def clear(self) -> None:
        """End the updating line before the table is printed."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self._start
