"""localinfer: CPU-first local LLM inference.

Importing this package stays light: numba, torch, llama_cpp and textual load only when a
backend or front end asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localinfer.errors import LocalInferError
from localinfer.sampling_params import SamplingParams

__version__ = "0.1.0"

if TYPE_CHECKING:
    from localinfer.llm import LLM

__all__ = ["LLM", "LocalInferError", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from localinfer.llm import LLM

        return LLM
    raise AttributeError(f"module 'localinfer' has no attribute {name!r}")
