"""Which device the Triton backend runs on: a CUDA GPU, or the CPU under Triton's interpreter.

TRITON_INTERPRET=1 makes every @triton.jit kernel run as numpy on torch CPU tensors — slow, but
the same kernel source, which is how the tests check the kernels on machines without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from localinfer.errors import BackendUnavailableError

if TYPE_CHECKING:
    import torch

NO_DEVICE = ("backend 'triton' needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is "
             "False here) or, to run its kernels on the CPU for testing, TRITON_INTERPRET=1")


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def pick_device() -> torch.device:
    """The GPU when there is one (TRITON_INTERPRET=1 forces the CPU), else a clear error."""
    import torch

    if interpreted():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    raise BackendUnavailableError(NO_DEVICE)


def describe() -> str:
    """One line for `localinfer info`: what --backend triton would run on, imported lazily."""
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return "triton (not installed: pip install 'localinfer[cuda]')"
    if interpreted():
        return "triton (TRITON_INTERPRET=1: kernels interpreted on the CPU)"
    import torch

    if not torch.cuda.is_available():
        return "triton (no CUDA GPU; TRITON_INTERPRET=1 runs it on the CPU, slowly)"
    props = torch.cuda.get_device_properties(0)
    return (f"triton ({props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"sm_{props.major}{props.minor})")
