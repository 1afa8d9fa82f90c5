"""TextStream: incremental text of one sequence, with stop strings held back.

Text that could still be the start of a stop string is not emitted until it is decided; on
a match the text ends before the stop string (or after it, if the request says so).
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, detokenizer: Any, stop: list[str], include_stop: bool = False) -> None:
        self.detokenizer = detokenizer  # .add(token_id) -> str, .flush() -> str
        self.stop = stop
        self.include_stop = include_stop
        self.held = ""  # decoded text not emitted yet (a possible stop-string prefix)
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text that may be emitted now. Sets `stopped` when a
        stop string completed (nothing further should be added)."""
        return self._push(self.detokenizer.add(token_id))

    def finish(self) -> str:
        """End of the sequence without a stop string: everything still pending."""
        if self.stopped:
            return ""
        text = self._push(self.detokenizer.flush())
        if not self.stopped:
            text, self.held = text + self.held, ""
        return text

    def _push(self, new: str) -> str:
        if self.stopped:
            return ""
        buf = self.held + new
        if not self.stop:
            self.held = ""
            return buf
        match = self._first_match(buf)
        if match is not None:
            start, s = match
            self.stopped = True
            self.held = ""
            return buf[: start + len(s)] if self.include_stop else buf[:start]
        keep = held_suffix(buf, self.stop)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def _first_match(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best


def held_suffix(buf: str, strings: list[str]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of `strings`: text
    that must wait, since the next token may complete the string."""
    best = 0
    for s in strings:
        for n in range(min(len(s) - 1, len(buf)), best, -1):
            if buf.endswith(s[:n]):
                best = n
                break
    return best
