"""The device of the Triton tests: the GPU when there is one and TRITON_INTERPRET is not set
(conftest.py sets it on machines without an NVIDIA device), else the CPU under Triton's
interpreter, with torch CPU tensors."""

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "") in ("", "0")
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
