"""The Numba CPU backend: our own kernels over GGUF-quantized weights.

Numba reads NUMBA_CACHE_DIR when it is first imported, so the package sets it before any of its
modules import numba: a second process then loads compiled kernels from disk instead of JIT-ing.
"""

import os

from localinfer.paths import kernel_cache_dir

os.environ.setdefault("NUMBA_CACHE_DIR", str(kernel_cache_dir()))
