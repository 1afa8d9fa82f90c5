"""CompileNotice: shows a progress display while the first step compiles the kernels.

Numba compiles a kernel the first time it runs with new argument types and keeps the machine
code in NUMBA_CACHE_DIR, keyed by this CPU; a new machine, a fresh bundle or an upgrade starts
empty, and the first step then spends tens of seconds in LLVM with nothing on the screen. A
stamp per (architecture, ISA, weight types, CPU, Numba version) in the cache folder records
that a step of that kind has completed, so the notice appears exactly when a compile is due.
Only what the loaded model calls is compiled: each kernel compiles on first use. The display
itself (localinfer/compile_progress.py) lives outside this package, whose sources key the cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType

from localinfer.compile_progress import CompileProgress


class CompileNotice:
    def __init__(self, *key: object, enabled: bool) -> None:
        import llvmlite.binding as llvm
        import numba

        # the features too: a forced AVX2 path narrows them (codegen_target.py) and compiles
        # anew, which deserves the display
        parts = (*key, llvm.get_host_cpu_name(), os.environ.get("NUMBA_CPU_FEATURES", ""),
                 numba.__version__)
        digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("NUMBA_CACHE_DIR") or ".")
        self.stamp = cache / "compiled" / digest
        self.pending = not self.stamp.exists()
        self.enabled = enabled
        self.kind = "/".join(map(str, key))  # the compile-time record's key
        self._progress: CompileProgress | None = None

    def __enter__(self) -> CompileNotice:
        if self.pending:
            self._progress = CompileProgress(self.kind, enabled=self.enabled)
            self._progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.__exit__(exc_type, exc, tb)
        if not self.pending or exc_type is not None:
            return
        self.pending = False
        try:
            self.stamp.parent.mkdir(parents=True, exist_ok=True)
            self.stamp.touch()
        except OSError:  # a read-only cache only means the display shows again next time
            pass
