"""EmulatedChecks: tests/arm64_neon_checks.py run on the arm64 python under qemu, in the
background of the test session.

Emulated JIT compiling is slow and single-threaded: on a slow 2-core CI host the checks took
1282 s and 747 s of CPU in their two processes (cold numba cache), longer than the rest of
their test module by far.  So conftest.py starts them when collection has selected the NEON
tests, at the lowest CPU priority (SCHED_IDLE, nice 19): they use the cycles the other tests
leave idle — much of the suite is one Python thread, or waits on a server — and yield the core
whenever a test wants it.  conftest.py also moves the NEON tests to the end of the session, so
the checks have had the whole suite's idle time when test_neon_kernels.py waits for them.

Two processes, one per core of a small CI machine: the matmul checks, and the rest (moving
the Q5_1 matmul check, 177 s, to the rest made the pair slower, 1497 s end to end against
1282, likely because that process then compiles the shared projection code too); no helper
beside the tiny model's first step (backends/numba_cpu/compile_ahead.py), which would be a
third.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import arm64_neon_checks as checks

REPO = Path(__file__).resolve().parents[1]
NATIVE = platform.machine().lower() in ("aarch64", "arm64")  # no emulation: checks in-process
ROOT = Path(os.environ.get("LOCALINFER_ARM64_ROOT",
                           Path.home() / ".cache" / "localinfer" / "arm64-root"))
LAUNCHER = ROOT / "bin" / "python"
# waiting for the checks, once test_neon_kernels.py asks: a guard against a hung emulator, not
# a speed target (the slow host above needs up to 1282 s if the suite left it no idle time)
WAIT_TIMEOUT_S = 1800


def groups() -> tuple[list[str], list[str]]:
    """The two processes' checks: the matmul ones, and the rest."""
    weights = [n for n in checks.CHECKS if n.startswith("weights_") or n == "instructions"]
    rest = [n for n in checks.CHECKS if n not in weights]
    return weights, rest


def cache_dir() -> Path:
    """The emulated run's numba cache, one per version of the backend's sources: numba checks
    only a cached function's own file, so code cached against an older callee (another file)
    would be reused stale — in this emulated setup that once crashed the loading process.
    Caches of older versions are removed (they live in the arm64 root, which is ours)."""
    h = hashlib.sha256()
    sources = [*(REPO / "backends" / "numba_cpu").rglob("*.py"),
               *(REPO / "tests").glob("arm64_*.py")]
    for f in sorted(sources):
        h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    caches = ROOT / "numba-cache"
    mine = caches / h.hexdigest()[:16]
    if caches.is_dir():
        for old in caches.iterdir():
            if old != mine:
                shutil.rmtree(old, ignore_errors=True)
    return mine


# exec'd by a host python that first lowers its own priority (both are inherited across exec
# and by qemu's threads): a preexec_fn would run Python in a fork of a threaded process
AT_IDLE_PRIORITY = """
import os, sys
os.nice(19)
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    pass  # nice 19 alone still yields to the tests
os.execv(sys.argv[1], sys.argv[1:])
"""


class EmulatedChecks:
    def __init__(self) -> None:
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir()),
               "LOCALINFER_COMPILE_AHEAD": "0"}
        self._tmp = tempfile.TemporaryDirectory(prefix="localinfer-arm64-")
        self.started = time.monotonic()
        self._runs: list[tuple[subprocess.Popen, Path, Path]] = []
        for i, names in enumerate(groups()):
            # output to files: a full pipe would stall a run until the other one ends
            out, err = Path(self._tmp.name) / f"{i}.out", Path(self._tmp.name) / f"{i}.err"
            with open(out, "w") as o, open(err, "w") as e:
                proc = subprocess.Popen(
                    [sys.executable, "-c", AT_IDLE_PRIORITY, str(LAUNCHER),
                     str(REPO / "tests" / "arm64_neon_checks.py"), *names],
                    stdout=o, stderr=e, text=True, cwd=REPO, env=env)
            self._runs.append((proc, out, err))

    def collect(self, timeout: float = WAIT_TIMEOUT_S) -> tuple[dict[str, dict], list[str]]:
        """Wait for both processes (at most `timeout` s from now): each check's JSON result by
        name, and a message for each process that did not exit 0."""
        deadline = time.monotonic() + timeout
        try:
            for proc, _, _ in self._runs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            self.stop()
        found, failures = {}, []
        for proc, out, err in self._runs:
            text = out.read_text()
            for line in text.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    found[r["name"]] = r
            if proc.returncode != 0:
                failures.append(f"exit {proc.returncode} after "
                                f"{time.monotonic() - self.started:.0f} s:\n{text[-3000:]}\n"
                                f"{err.read_text()[-3000:]}")
        self._tmp.cleanup()
        return found, failures

    def stop(self) -> None:
        for proc, _, _ in self._runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


_started: EmulatedChecks | None = None


def start() -> EmulatedChecks:
    """Start the checks once a session (LAUNCHER must exist); later calls return the same
    run."""
    global _started
    if _started is None:
        _started = EmulatedChecks()
    return _started


def stop() -> None:
    if _started is not None:
        _started.stop()
