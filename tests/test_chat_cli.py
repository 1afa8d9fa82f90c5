"""`localinfer chat` as installed: the line REPL on piped stdin, the TUI in a real terminal."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXE = Path(sys.executable).with_name("localinfer")
PASS_ENV = ("PYTHONPATH", "LOCALINFER_HOME", "NUMBA_CACHE_DIR", "NUMBA_NUM_THREADS", "HOME", "PATH")


def chat_cmd(model: Path, *extra: str) -> list[str]:
    return [str(EXE), "chat", "--model", str(model), "-t", "0", "-n", "12", *extra]


def test_plain_repl_with_piped_stdin(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LOCALINFER_DATA_DIR": str(tmp_path)}
    lines = ("Hello!\nWhat can you do?\n/stats\n/set top_p 2\n/set top_k 5\n/set temperature default\n"
             "/quit\n")
    # stdout is a pipe, so chat falls back to the line REPL without --plain
    proc = subprocess.run(chat_cmd(smollm2_path), input=lines, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    replies = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(replies) >= 2, proc.stdout
    assert "Traceback" not in proc.stderr
    cached = re.search(r"\((\d+) from the prefix cache", proc.stderr)
    assert cached and int(cached.group(1)) > 0, proc.stderr  # the second turn reused the first
    assert "error: invalid top_p" in proc.stderr
    # /set shows the effective settings: -t 0 from the flag, the rest SmolLM2's (llama.cpp's)
    assert "sampling: greedy (temperature 0), max tokens 12" in proc.stderr
    assert ("sampling: temp 0.8 (llama.cpp), top_k 5 (set), top_p 0.95 (llama.cpp), "
            "min_p 0.05 (llama.cpp), repeat_penalty 1 (llama.cpp), max tokens 12") in proc.stderr
    saved = list((tmp_path / "chats").glob("*.json"))
    assert len(saved) == 1


def test_plain_missing_model_is_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, "LOCALINFER_DATA_DIR": str(tmp_path)}
    proc = subprocess.run(chat_cmd(tmp_path / "nope.gguf", "--plain"), input="hi\n",
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("localinfer: error: model file not found")


class Tmux:
    def __init__(self, name: str) -> None:
        self.base = ["tmux", "-L", name, "-f", "/dev/null"]
        self.name = name

    def __call__(self, *args: str) -> str:
        out = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30)
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.name)

    def wait_for(self, pattern: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = self.screen()
            if re.search(pattern, text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"{pattern!r} never appeared on screen:\n{self.screen()}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_tui_in_a_real_terminal(smollm2_path: Path, tmp_path: Path) -> None:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env["LOCALINFER_DATA_DIR"] = str(tmp_path)
    env["TERM"] = "xterm-256color"
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"env -i {assigns} {shlex.join(chat_cmd(smollm2_path, '--new'))}; "
               "echo EXITED $?; sleep 30")
    tmux = Tmux(f"li-chat-{os.getpid()}")
    tmux("new-session", "-d", "-s", tmux.name, "-x", "120", "-y", "40", command)
    try:
        tmux.wait_for(r"SmolLM2\S* ready", timeout=120)
        tmux("send-keys", "-t", tmux.name, "Say hello to me", "Enter")
        screen = tmux.wait_for(r"ready │ TTFT \d+ ms", timeout=120)
        lines = screen.splitlines()
        start = next(i for i, line in enumerate(lines) if "Assistant" in line)
        reply = [ln.strip(" █") for ln in lines[start + 1:] if ln.strip(" █")]
        assert reply and not reply[0].startswith("╭"), screen  # words under "Assistant"
        tmux("send-keys", "-t", tmux.name, "C-q")
        screen = tmux.wait_for(r"EXITED \d+", timeout=30)
        assert "EXITED 0" in screen and "Traceback" not in screen, screen
    finally:
        tmux("kill-server")
    assert len(list((tmp_path / "chats").glob("*.json"))) == 1
