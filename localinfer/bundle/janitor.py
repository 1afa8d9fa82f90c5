"""Janitor: removes a bundle build's temp files when the builder dies, even by kill -9.

A killed process cannot clean up after itself, so `bundle create` starts this small process in
its own session first and keeps the write end of a pipe to it. The kernel closes that pipe
however the builder ends; the janitor then reads either "done" (the output was renamed into
place, or the builder removed its temp files itself after an error: nothing to do) or
end-of-file (the builder died: remove the temp folder and temp
archive). pip children die with the builder (pip_run's die_with_parent), so the removal is
repeated for a moment in case one was still writing.

    python -m localinfer.bundle.janitor FOLDER NAME_GLOB...   # globs are relative to FOLDER
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DONE = b"done"


class Janitor:
    def __init__(self, folder: Path, globs: list[str]) -> None:
        read_end, self._write_end = os.pipe()  # both ends non-inheritable by default
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "localinfer.bundle.janitor", str(folder), *globs],
            stdin=read_end, start_new_session=os.name == "posix")
        os.close(read_end)

    def abandon(self) -> None:
        """The build failed: hang up without "done", so the janitor removes whatever is left
        (again for a moment, in case a child was still writing), and do not wait for it."""
        with contextlib.suppress(OSError):
            os.close(self._write_end)

    def release(self) -> None:
        """The output is in place, or the builder cleaned up itself: the janitor exits."""
        with contextlib.suppress(OSError):
            os.write(self._write_end, DONE)
        with contextlib.suppress(OSError):
            os.close(self._write_end)
        self._proc.wait()


def _remove(folder: Path, globs: list[str]) -> None:
    for pattern in globs:
        for path in folder.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def main(argv: list[str]) -> int:
    folder, globs = Path(argv[1]), argv[2:]
    if sys.stdin.buffer.read() == DONE:
        return 0
    for _ in range(10):  # a dying pip child may still write for a moment
        _remove(folder, globs)
        time.sleep(0.2)
    _remove(folder, globs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
