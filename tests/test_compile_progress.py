"""The first-compile display: a live bar on a terminal, a few plain lines in a log, or a UI's
callback; elapsed time against the last compile recorded on this machine."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path

import pytest

from localinfer import compile_progress
from localinfer.compile_progress import CompileProgress, LogReporter, expected_seconds


class Terminal(io.StringIO):
    """What a terminal's stderr receives (ProgressBar draws only where isatty())."""

    def isatty(self) -> bool:
        return True


def slow_compile(seconds: float) -> None:  # stands in for Numba busy in LLVM
    time.sleep(seconds)


def test_terminal_gets_one_live_line_and_the_time_is_recorded(tmp_path: Path) -> None:
    record = tmp_path / "compile_seconds.json"
    record.write_text(json.dumps({"llama/avx2/Q4_0": 3}))
    term = Terminal()
    with CompileProgress("llama/avx2/Q4_0", enabled=True, stream=term, record=record) as p:
        assert (p.expected, p.recorded) == (3, True)
        slow_compile(1.4)
    out = term.getvalue()
    assert out.count("\n") == 1 and out.endswith("\n")  # one line, redrawn in place
    frames = out.rstrip("\n").split("\r")[1:]
    assert frames[0].startswith("compiling the kernels for this CPU") and "0 s/~3 s" in frames[0]
    assert any("1 s/~3 s" in f for f in frames)
    assert frames[-1].startswith("kernels compiled in 1.")
    assert json.loads(record.read_text())["llama/avx2/Q4_0"] == pytest.approx(1.4, abs=0.3)


def test_a_log_gets_a_few_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_progress, "PLAIN_EVERY_S", 0.5)
    log = io.StringIO()
    record = tmp_path / "none.json"
    with CompileProgress("gemma3/avx512/Q4_K", enabled=True, stream=log, record=record):
        slow_compile(1.3)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == ("compiling the kernels for this CPU (once; expected "
                        f"~{compile_progress.ESTIMATE_S} s, an estimate) ...")
    assert 1 <= len(lines) - 2 <= 3 and lines[-1].startswith("kernels compiled in")
    assert expected_seconds("qwen2/avx2/Q8_0", record) == (1, True)  # any kind's, when known


def test_a_ui_callback_replaces_stderr_and_an_overrun_raises_the_guess(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    updates: list[tuple[str, int, int | None]] = []
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"llama/generic/F32": 1}))
    compile_progress.report_to(lambda *u: updates.append(u))
    try:
        with CompileProgress("llama/generic/F32", enabled=True, record=record):
            slow_compile(2.3)
    finally:
        compile_progress.report_to(None)
    assert capsys.readouterr().err == ""
    assert updates[0][1:] == (0, 1)
    running = updates[1:-1]
    assert running and all(done < total for _, done, total in running)  # never "done" early
    assert max(total for *_, total in running) > 1  # the guess grew past the record
    assert updates[-1][1] == updates[-1][2] == 2  # complete: elapsed == expected


def test_a_failed_compile_is_not_recorded(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    term = Terminal()
    with pytest.raises(RuntimeError), CompileProgress("k", enabled=True, stream=term,
                                                      record=record):
        raise RuntimeError("LLVM said no")
    assert "stopped after" in term.getvalue() and not record.exists()


def test_serve_logs_start_progress_and_end(caplog: pytest.LogCaptureFixture) -> None:
    report = LogReporter(logging.getLogger("localinfer.server"), every=10)
    with caplog.at_level(logging.INFO, logger="localinfer.server"):
        for done in (0, 4, 11, 17, 23, 30):
            report("compiling the kernels for this CPU", done, 40 if done < 30 else 30)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["compiling the kernels for this CPU (once; expected ~40 s) ...",
                        "compiling the kernels for this CPU: 11 s of ~40 s",
                        "compiling the kernels for this CPU: 23 s of ~40 s",
                        "kernels compiled in 30 s (cached for later starts)"]
