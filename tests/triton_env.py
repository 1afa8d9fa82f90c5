"""Import first in Triton tests: without a CUDA GPU, the kernels run under Triton's interpreter
(TRITON_INTERPRET must be set before any @triton.jit kernel is defined) on torch CPU tensors;
with one, the same tests run on the GPU."""

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "") in ("", "0")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
