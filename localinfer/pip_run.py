"""run_pip: pip as a subprocess (so the user's index settings apply), its log folded into one
progress line instead of pages of "Collecting ..." lines.

pip 24.1 and newer print machine-readable download progress with `--progress-bar raw`
("Progress DONE of TOTAL" lines); with it we show the file being fetched and the bytes so far in
one ProgressBar. Older pips run quietly, in a temp folder (TMPDIR) of their own: pip downloads
each file there before it moves it to its destination, so the files' sizes are the byte count.
pip's errors are kept and the first relevant line becomes the error message.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

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
            die_with_parent: bool = False, bar: ProgressBar | None = None) -> None:
    """Run `python -m pip ARGS`; raise `error` with pip's reason when it fails. `progress`
    draws one bar on stderr (when it is a terminal); `on_progress` gets the same updates.
    `bar`: a caller's bar to draw in (a pull's one display), restarted at `label` and left
    open; `progress`, `total` and `on_progress` then come from it."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    raw = _raw_progress_supported()
    cmd += ["--progress-bar", "raw"] if raw else ["--quiet"]
    with tempfile.TemporaryDirectory(prefix="localinfer-pip-") as pip_tmp:
        env = os.environ if raw else {**os.environ, "TMPDIR": pip_tmp}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, preexec_fn=_die_with_parent if die_with_parent
                                and sys.platform == "linux" else None)
        errors: list[str] = []
        try:
            reader = threading.Thread(target=lambda: errors.extend(proc.stderr or []),
                                      daemon=True)
            reader.start()
            if bar is None:
                with ProgressBar(total, label, enabled=None if progress else False,
                                 on_update=on_progress) as own:
                    _follow(proc, own, label, None if raw else Path(pip_tmp))
            else:
                bar.restart(label, None)
                _follow(proc, bar, label, None if raw else Path(pip_tmp))
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


def _follow(proc: subprocess.Popen[str], bar: ProgressBar, label: str,
            pip_tmp: Path | None) -> None:
    """pip's stdout into the bar: the file being fetched, and the bytes so far; or, from a
    quiet pip (`pip_tmp`: its TMPDIR), the bytes of the files it wrote there."""
    if pip_tmp is not None:
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(pip_tmp, bar, stop), daemon=True)
        watcher.start()
        try:
            for _ in proc.stdout or []:
                pass
        finally:
            stop.set()
            watcher.join()
        return
    done_before = last = 0  # bytes of finished files; bytes of the current one
    for line in proc.stdout or []:
        if m := _PROGRESS.match(line):
            now = int(m.group(1))
            if now < last:  # a new file began
                done_before += last
            if bar.total is None or bar.total < done_before + int(m.group(2)):
                bar.total = done_before + int(m.group(2))  # pip knows the wheel's size
            bar.update(done_before + now - bar.done)
            last = now
        elif m := (_DOWNLOADING.match(line) or _NAMED.match(line)):
            name = m.group(1).rsplit("/", 1)[-1]
            bar.label = f"{label} ({name[:48]})"


def _watch(folder: Path, bar: ProgressBar, stop: threading.Event) -> None:
    seen: dict[str, int] = {}  # every file pip wrote there, at its largest (moved ones stay)
    while not stop.wait(0.25):
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):  # moved or removed while we looked
                    seen[path] = max(seen.get(path, 0), os.stat(path).st_size)
        held = sum(seen.values())
        if held > bar.done:
            bar.update(held - bar.done)


def _die_with_parent() -> None:
    """In the pip child: die with its parent (a killed `bundle create` must not leave pip
    writing into the temp folder its janitor removes). Linux only."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
