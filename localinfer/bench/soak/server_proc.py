"""`localinfer serve` as a child process, so the soak can read its RSS from /proc/PID.

The server's log goes to a file beside the JSON report (or a temp file), shown on failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from localinfer.errors import LocalInferError

READY_TIMEOUT_S = 900.0  # a cold kernel compile on a busy 2-core machine is slow


@dataclass(slots=True)
class ServerOptions:
    model: str
    max_num_seqs: int = 16
    max_queue: int = 16
    max_prefill_backlog: int | None = None
    ctx: int = 2048
    threads: int | None = None
    extra: tuple[str, ...] = ()

    def argv(self, port: int) -> list[str]:
        argv = [sys.executable, "-m", "localinfer", "serve", "--model", self.model,
                "--port", str(port), "--max-num-seqs", str(self.max_num_seqs),
                "--max-queue", str(self.max_queue), "--ctx", str(self.ctx),
                "--log-level", "warning", *self.extra]
        if self.max_prefill_backlog is not None:
            argv += ["--max-prefill-backlog", str(self.max_prefill_backlog)]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv


class ServerProcess:
    def __init__(self, options: ServerOptions, log_path: Path | None = None) -> None:
        self.options = options
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="soak-serve-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> ServerProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.options.argv(self.port), stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ})
        end = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise LocalInferError(f"the server exited with {self.proc.returncode} while "
                                      f"starting: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.25)
        self.stop()
        raise LocalInferError(f"the server was not ready after {READY_TIMEOUT_S:.0f} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (drain), then SIGKILL after 30 s; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
