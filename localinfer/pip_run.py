"""run_pip: pip as a subprocess (so the user's index settings apply), its log folded into one
progress line instead of pages of "Collecting ..." lines.

pip 24.1 and newer print machine-readable download progress with `--progress-bar raw`
("Progress DONE of TOTAL" lines); with it we show the file being fetched and the bytes so far in
one ProgressBar. Older pips run quietly. pip's errors are kept and the first relevant line
becomes the error message.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from importlib.metadata import PackageNotFoundError, version

from localinfer.errors import LocalInferError
from localinfer.progress import ProgressBar, ProgressCallback

_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)")
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)")
_NAMED = re.compile(r"^(?:Collecting|Processing|Saved|File was already downloaded) (\S+)")


def _raw_progress_supported() -> bool:
    try:
        major, minor = (int(x) for x in version("pip").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (24, 1)


def run_pip(args: list[str], *, label: str, progress: bool, error: type[LocalInferError],
            total: int | None = None, on_progress: ProgressCallback | None = None,
            die_with_parent: bool = False) -> None:
    """Run `python -m pip ARGS`; raise `error` with pip's reason when it fails. `progress`
    draws one bar on stderr (when it is a terminal); `on_progress` gets the same updates."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    raw = _raw_progress_supported()
    cmd += ["--progress-bar", "raw"] if raw else ["--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent if die_with_parent
                            and sys.platform == "linux" else None)
    errors: list[str] = []
    try:
        reader = threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True)
        reader.start()
        bar = ProgressBar(total, label, enabled=None if progress else False,
                          on_update=on_progress)
        _follow(proc, bar, label)
    except BaseException:  # Ctrl-C or an error here: pip must not go on writing
        proc.kill()
        proc.wait()
        raise
    proc.wait()
    reader.join()
    if proc.returncode != 0:
        relevant = [ln.strip() for ln in errors if ln.startswith("ERROR")
                    or "No matching distribution" in ln]
        tail = (relevant or [ln.strip() for ln in errors if ln.strip()][-1:] or ["pip failed"])
        raise error(f"{label} failed: {tail[0]}")


def _follow(proc: subprocess.Popen[str], bar: ProgressBar, label: str) -> None:
    """pip's stdout into the bar: the file being fetched, and the bytes so far."""
    done_before = last = 0  # bytes of finished files; bytes of the current one
    with bar:
        for line in proc.stdout or []:
            if m := _PROGRESS.match(line):
                now = int(m.group(1))
                if now < last:  # a new file began
                    done_before += last
                bar.update(done_before + now - bar.done)
                last = now
            elif m := (_DOWNLOADING.match(line) or _NAMED.match(line)):
                name = m.group(1).rsplit("/", 1)[-1]
                bar.label = f"{label} ({name[:48]})"


def _die_with_parent() -> None:
    """In the pip child: die with its parent (a killed `bundle create` must not leave pip
    writing into the temp folder its janitor removes). Linux only."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
