"""CompileProgress: a live display while the first step compiles the kernels.

Numba compiles inside the step call and reports nothing, so a thread ticks a ProgressBar with
the elapsed time against the expected duration: the last compile of this model kind on this
machine if one was recorded, else the last compile of any kind, else an estimate. The record
lives in the kernel cache's parent folder (paths.kernel_cache_dir), which survives an upgrade
that starts a fresh cache, the very case in which the compile comes back.

Where it shows: a bar on a terminal's stderr; a few plain lines on any other stderr; or, once
report_to() has named a callback, only there (the chat app draws it in its status bar, where
stderr would tear the screen; serve logs it beside uvicorn's lines).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TextIO

from localinfer.atomic_file import atomic_write
from localinfer.paths import kernel_cache_dir
from localinfer.progress import ProgressBar, ProgressCallback

ESTIMATE_S = 60  # nothing recorded yet (2-core box: 30-100 s; a big desktop: 15-25 s)
PLAIN_EVERY_S = 15.0  # a log gets a line this often, not a carriage-return stream
TICK_S = 0.25
LABEL = "compiling the kernels for this CPU"

_listener: ProgressCallback | None = None


def report_to(callback: ProgressCallback | None) -> None:
    """Send compile progress to `callback(label, elapsed_s, expected_s)` instead of stderr
    (None: back to stderr). The elapsed time reaches the expected one only when done (an
    overrun raises the expected time)."""
    global _listener
    _listener = callback


class LogReporter:
    """A report_to() callback that writes log lines: the start, every PLAIN_EVERY_S, the end
    (serve: the compile runs on the loader thread while uvicorn logs on stderr)."""

    def __init__(self, log: logging.Logger, every: float = PLAIN_EVERY_S) -> None:
        self.log = log
        self.every = every
        self._next = 0.0

    def __call__(self, label: str, done: int, total: int | None) -> None:
        expected = total or 0
        if done == 0:
            self._next = self.every
            self.log.info("%s (once; expected ~%d s) ...", label, expected)
        elif done >= expected:
            self.log.info("kernels compiled in %d s (cached for later starts)", done)
        elif done >= self._next:
            self._next += self.every
            self.log.info("%s: %d s of ~%d s", label, done, expected)


def record_path() -> Path:
    return kernel_cache_dir() / "compile_seconds.json"


def _records(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and v > 0}


def expected_seconds(kind: str, path: Path | None = None) -> tuple[int, bool]:
    """(seconds, recorded): this kind's last compile, else the latest of any, else ESTIMATE_S."""
    records = _records(path or record_path())
    if kind in records:
        return max(1, round(records[kind])), True
    if records:
        return max(1, round(list(records.values())[-1])), True
    return ESTIMATE_S, False


class CompileProgress:
    def __init__(self, kind: str, *, enabled: bool, stream: TextIO | None = None,
                 record: Path | None = None) -> None:
        """kind: what is compiled (architecture, ISA, weight types); enabled: draw on stderr
        (a report_to() callback gets the updates either way)."""
        self.kind = kind
        self.record = record or record_path()
        self.expected, self.recorded = expected_seconds(kind, self.record)
        self.enabled = enabled
        self.stream = stream
        self.elapsed = 0.0
        self._bar: ProgressBar | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> CompileProgress:
        listener = _listener
        show = False if listener is not None or not self.enabled else None
        how = "as long as the last compile here" if self.recorded else "an estimate"
        bar = ProgressBar(self.expected, LABEL, enabled=show, stream=self.stream, unit="s",
                          on_update=listener, plain_every=PLAIN_EVERY_S)
        if show is None and not bar.enabled:  # a log: say what the wait is, once
            bar.stream.write(f"{LABEL} (once; expected ~{self.expected} s, {how}) ...\n")
            bar.stream.flush()
        self._bar, self._start = bar, time.monotonic()
        bar.update(0)  # drawn (and reported) at once, not a second later
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="localinfer-compile",
                                        daemon=True)
        self._ticker.start()
        return self

    def _tick(self) -> None:
        bar = self._bar
        assert bar is not None
        while not self._stop.wait(TICK_S):
            elapsed = int(time.monotonic() - self._start)
            if elapsed >= (bar.total or 0):  # longer than expected: a new guess, never "100%"
                bar.total = round(elapsed * 1.25) + 1
            if elapsed > bar.done:
                bar.update(elapsed - bar.done)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        bar, self._bar = self._bar, None
        if bar is None:
            return
        self.elapsed = time.monotonic() - self._start
        if exc_type is not None:
            bar.close(f"{LABEL}: stopped after {self.elapsed:.0f} s")
            return
        bar.total = bar.done = max(1, round(self.elapsed))  # the callback sees it complete
        bar.close(f"kernels compiled in {self.elapsed:.1f} s (cached for later runs)")
        self._save()

    def _save(self) -> None:
        records = _records(self.record)
        records.pop(self.kind, None)  # re-inserted last: the latest is the fallback for others
        records[self.kind] = round(self.elapsed, 1)
        try:
            with atomic_write(self.record) as f:
                f.write((json.dumps(records, indent=1) + "\n").encode())
        except OSError:  # a read-only cache only costs the estimate next time
            pass
