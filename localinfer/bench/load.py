"""A busy machine on demand (`localinfer bench --load N`): N CPU-bound processes run beside
every measurement, the same for both sides, so one run shows how each engine copes when
another program wants the cores (a build, a browser, a second model).

Each competitor is a plain Python busy loop at normal priority: it takes a whole core when
the scheduler gives it one, like any compute-bound neighbour.  Comparing a quiet run with a
loaded one gives each side's slowdown; within one loaded run the ratios say who copes better.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

BUSY_LOOP = "while True:\n    pass\n"


@contextmanager
def competing_load(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run `n` busy processes for the duration of the block (none when n == 0)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
