"""CompileNotice: tells the user when the first step compiles the kernels, and how long it took.

Numba compiles a kernel the first time it runs with new argument types and keeps the machine
code in NUMBA_CACHE_DIR, keyed by this CPU; a new machine, a fresh bundle or an upgrade starts
empty, and the first step then spends tens of seconds in LLVM with nothing on the screen. A
stamp per (architecture, ISA, weight types, CPU, Numba version) in the cache folder records
that a step of that kind has completed, so the notice appears exactly when a compile is due.
Only what the loaded model calls is compiled: each kernel compiles on first use.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from types import TracebackType


class CompileNotice:
    def __init__(self, *key: object, enabled: bool) -> None:
        import llvmlite.binding as llvm
        import numba

        parts = (*key, llvm.get_host_cpu_name(), numba.__version__)
        digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("NUMBA_CACHE_DIR") or ".")
        self.stamp = cache / "compiled" / digest
        self.pending = not self.stamp.exists()
        self.enabled = enabled
        self._start = 0.0

    def __enter__(self) -> CompileNotice:
        if self.pending:
            self._start = time.monotonic()
            if self.enabled:
                print("compiling the kernels for this CPU (once; about a minute, later starts "
                      "load them from the cache) ...", file=sys.stderr, flush=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.pending or exc_type is not None:
            return
        self.pending = False
        try:
            self.stamp.parent.mkdir(parents=True, exist_ok=True)
            self.stamp.touch()
        except OSError:  # a read-only cache only means the notice shows again next time
            pass
        if self.enabled:
            print(f"kernels compiled in {time.monotonic() - self._start:.1f} s "
                  f"(cached in {self.stamp.parent.parent})", file=sys.stderr, flush=True)
