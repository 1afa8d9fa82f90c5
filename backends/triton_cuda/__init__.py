"""The Triton backend: GGUF weights kept quantized on an NVIDIA GPU, Triton kernels over torch.

Triton reads TRITON_CACHE_DIR when it first compiles, so the package points it under
localinfer's cache dir before any kernel module imports triton: a second process loads the
compiled kernels instead of compiling them again, and `localinfer rm`-style cleanup of the
cache dir covers them.  An explicit TRITON_CACHE_DIR wins.
"""

import os

from localinfer.paths import home

os.environ.setdefault("TRITON_CACHE_DIR", str(home() / "triton"))
