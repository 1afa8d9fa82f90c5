"""The Numba CPU backend: our own kernels over GGUF-quantized weights.

Numba reads NUMBA_CACHE_DIR when it is first imported, so the package sets it before any of its
modules import numba: a second process then loads compiled kernels from disk instead of JIT-ing.
Numba's cache checks only the source file of the function it loads, not the files that function
calls, so the folder is keyed by a digest of this package's sources: editing any kernel (or
upgrading) starts a fresh cache instead of loading stale machine code.  A forced AVX2 path
narrows what LLVM may emit before anything compiles (codegen_target.py).
"""

import hashlib
import os
from pathlib import Path

from localinfer.paths import kernel_cache_dir

from .codegen_target import narrow_for_forced_isa


def _source_digest() -> str:
    h = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# also keys the repacked-weight cache (cached_weights.py): the repacking code is in here too
SOURCE_DIGEST = _source_digest()
os.environ.setdefault("NUMBA_CACHE_DIR", str(kernel_cache_dir() / SOURCE_DIGEST))
narrow_for_forced_isa()
