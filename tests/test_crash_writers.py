"""Crash safety of every writer (RELIABILITY.md #31): a short run of tools/crash_writers.py (kills
at random moments and, as root, full tmpfs disks, for every writer), and the failures it found
on the writers as they were, each killed at the moment that broke them and then run again the
way a user would: the next run must leave the target whole and no temp file behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import crash_cases  # noqa: E402
import crash_writers  # noqa: E402


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("crash-inputs")
    crash_cases.make_inputs(folder)
    return folder


def _can_mount() -> bool:
    return os.geteuid() == 0


def test_short_run_over_every_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALINFER_HOME", os.environ.get("LOCALINFER_HOME", str(tmp_path)))
    out = tmp_path / "tallies.json"
    args = ["--runs", "4", "--seed", "1", "--json", str(out)]
    rc = crash_writers.main(args + ([] if _can_mount() else ["--no-enospc"]))
    tallies = {t["writer"]: t for t in json.loads(out.read_text())}
    assert set(tallies) == {c.name for c in crash_cases.CASES}
    for name, t in tallies.items():
        assert (t["corrupt"], t["leftovers"]) == (0, 0), (name, t["problems"])
        if _can_mount():
            assert t["kill_runs"] == t["enospc_runs"] == 2, name
            # sized to run out part-way: every full-disk run fails, each with a clear line
            assert t["enospc_failed"] == t["clear_errors"] == 2, (name, t["problems"])
    assert rc == 0


def _li(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localinfer", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _hidden(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*"))


def _kill_when(argv: list[str], env: dict[str, str], seen: Callable[[], bool]) -> bool:
    """Start argv, SIGKILL it the moment `seen()` holds; False if it finished first."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            if seen():
                proc.send_signal(signal.SIGKILL)
                return True
            time.sleep(0.001)
        return False
    finally:
        proc.wait()


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, LOCALINFER_HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path))


def test_killed_hf_conversion_leaves_no_source_copy(inputs: Path, tmp_path: Path) -> None:
    """Found: a kill after the HF conversion left `.OUT.hf-source.part` (a fixed name no sweep
    knew) beside the output for good. Now it lives in a locked temp folder."""
    out, env = tmp_path / "out", _env(tmp_path)
    out.mkdir()
    argv = [sys.executable, "-m", "localinfer", "quantize", str(inputs / "hf"),
            str(out / "m.gguf"), "--type", "q8_0", "--no-progress"]
    killed = any(_kill_when(argv, env, lambda: any(out.glob(".m.gguf.hf-source.*/source.gguf")))
                 for _ in range(5))
    assert killed, "the conversion was never caught half-way"
    assert not (out / "m.gguf").exists()
    assert _li(*argv[3:], env=env).returncode == 0  # the next run
    assert _hidden(out) == []
    crash_cases.gguf_state(out / "m.gguf")


def test_killed_extract_leaves_no_partial_bundle(inputs: Path, tmp_path: Path) -> None:
    """Found (by reading, then by kills inside the write): extract wrote straight into the
    destination, so a kill left a half bundle there. Now the folder appears whole or not at
    all, and the next extract sweeps the killed one's temp folder."""
    out, env = tmp_path / "out", _env(tmp_path)
    out.mkdir()
    argv = [sys.executable, "-m", "localinfer", "bundle", "extract", str(inputs / "bundle.zip"),
            str(out / "x")]
    killed = any(_kill_when(argv, env, lambda: any(out.glob(".x.*.part/demo/models/*")))
                 for _ in range(5))
    assert killed, "the extraction was never caught half-way"
    assert not (out / "x").exists()
    assert _li(*argv[3:], env=env).returncode == 0
    assert _hidden(out) == []
    assert crash_cases.tree_state(out / "x") is not None


@pytest.mark.parametrize("writer", ["quantize", "chat-save"])
def test_next_run_sweeps_what_a_kill_left(inputs: Path, tmp_path: Path, writer: str) -> None:
    """Found: temps of SIGKILLed quantize and chat saves stayed (the sweep removed only
    files idle for 2 minutes, and chat saves never swept). Now the next write in the folder
    removes every temp whose writer is dead, at once."""
    env = _env(tmp_path)
    folder = tmp_path / ("chats" if writer == "chat-save" else "out")
    folder.mkdir()
    target = folder / ("c0ffee.json" if writer == "chat-save" else "m.gguf")
    hold = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert hold.stdout is not None and hold.stdout.readline().strip() == "ready"
    hold.send_signal(signal.SIGKILL)
    hold.wait()
    assert len(_hidden(folder)) == 1
    if writer == "chat-save":
        (inputs / "chat_new.json").write_text(json.dumps(crash_cases._chat_conv(3, "x")))
        run = subprocess.run([sys.executable, "-c", crash_cases.CHAT_SCRIPT, str(folder),
                              str(inputs / "chat_new.json"), "1"], env=env, timeout=60)
        assert run.returncode == 0
        assert crash_cases.chat_state(target) is not None
    else:
        assert _li("quantize", str(inputs / "src32.gguf"), str(target), "--type", "q8_0",
                   "--no-progress", env=env).returncode == 0
        crash_cases.gguf_state(target)
    assert _hidden(folder) == []


HOLD = """
import sys, time
from pathlib import Path
from localinfer.atomic_file import atomic_write
with atomic_write(Path(sys.argv[1])) as f:
    f.write(b"half a file" * 1000)
    f.flush()
    print("ready", flush=True)
    time.sleep(60)
"""
