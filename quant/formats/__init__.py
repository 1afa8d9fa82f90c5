"""Block formats as classes: FORMATS maps a ggml type id to its QuantFormat subclass."""

from __future__ import annotations

from localinfer.errors import UnsupportedModelError

from .base import QuantFormat
from .floats import BF16, F16, F32
from .q4 import Q4_0, Q4_1
from .q5 import Q5_0, Q5_1
from .q6_k import Q6_K
from .q8 import Q8_0
from .q23_k import Q2_K, Q3_K
from .q45_k import Q4_K, Q5_K

FORMATS: dict[int, type[QuantFormat]] = {
    f.ggml_type: f
    for f in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
}
BY_NAME: dict[str, type[QuantFormat]] = {f.name: f for f in FORMATS.values()}


def format_for(ggml_type: int) -> type[QuantFormat]:
    fmt = FORMATS.get(int(ggml_type))
    if fmt is None:
        raise UnsupportedModelError(f"tensor type {ggml_type} is not supported by the quantizer")
    return fmt


__all__ = ["BF16", "BY_NAME", "F16", "F32", "FORMATS", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K",
           "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "QuantFormat", "format_for"]
