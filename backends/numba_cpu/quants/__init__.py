"""Weight formats the Numba backend reads, keyed by ggml type.

Adding a type = one small module with an `unpack(raw, rows, cols) -> Packed` function that maps
its blocks onto one of the kernel layouts in packed.py, plus one line in FORMATS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localinfer.errors import UnsupportedModelError

from .floats import unpack_bf16, unpack_f16, unpack_f32
from .iq4 import unpack_iq4_nl, unpack_iq4_xs
from .kquants import unpack_q3_k, unpack_q4_k, unpack_q5_k
from .packed import KIND_F32, KIND_Q4, KIND_Q5, KIND_Q8, QBLOCK, Packed, concat_rows
from .q4 import unpack_q4_0, unpack_q4_1
from .q5 import unpack_q5_0, unpack_q5_1
from .q8 import unpack_q8_0
from .requant import unpack_q2_k, unpack_q6_k

__all__ = ["FORMATS", "KIND_F32", "KIND_Q4", "KIND_Q5", "KIND_Q8", "QBLOCK", "Packed",
           "concat_rows", "format_for", "unpack_tensor"]


@dataclass(frozen=True, slots=True)
class WeightFormat:
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block
    unpack: Callable[[np.ndarray, int, int], Packed]
    kind: int = KIND_Q8  # the layout unpack returns, known before any tensor is read
    zero: int = 0  # its KIND_Q4 / KIND_Q5 code offset


# ggml type id -> format (ids from ggml.h / gguf.GGMLQuantizationType).  Every mapping is exact
# except: Q4_K, Q5_K and IQ4_XS round their per-32 scales to f16 (kquants.py, iq4.py), and
# Q2_K and Q6_K are requantized to 8 bits (requant.py).
FORMATS: dict[int, WeightFormat] = {
    0: WeightFormat("F32", 1, 4, unpack_f32, KIND_F32),
    1: WeightFormat("F16", 1, 2, unpack_f16, KIND_F32),
    30: WeightFormat("BF16", 1, 2, unpack_bf16, KIND_F32),
    2: WeightFormat("Q4_0", 32, 18, unpack_q4_0, KIND_Q4, 8),
    3: WeightFormat("Q4_1", 32, 20, unpack_q4_1, KIND_Q4),
    6: WeightFormat("Q5_0", 32, 22, unpack_q5_0, KIND_Q5, 16),
    7: WeightFormat("Q5_1", 32, 24, unpack_q5_1, KIND_Q5),
    8: WeightFormat("Q8_0", 32, 34, unpack_q8_0),
    10: WeightFormat("Q2_K", 256, 84, unpack_q2_k),
    11: WeightFormat("Q3_K", 256, 110, unpack_q3_k),
    12: WeightFormat("Q4_K", 256, 144, unpack_q4_k, KIND_Q4),
    13: WeightFormat("Q5_K", 256, 176, unpack_q5_k),
    14: WeightFormat("Q6_K", 256, 210, unpack_q6_k),
    20: WeightFormat("IQ4_NL", 32, 18, unpack_iq4_nl),
    23: WeightFormat("IQ4_XS", 256, 136, unpack_iq4_xs),
}


def format_for(name: str, ggml_type: int, type_name: str) -> WeightFormat:
    fmt = FORMATS.get(ggml_type)
    if fmt is None:
        supported = ", ".join(f.name for f in FORMATS.values())
        raise UnsupportedModelError(
            f"tensor {name} has type {type_name}, which the numba backend does not support "
            f"(supported: {supported})"
        )
    return fmt


def unpack_tensor(name: str, ggml_type: int, type_name: str, raw: np.ndarray,
                  shape: tuple[int, ...]) -> Packed:
    """Raw tensor bytes, ggml shape (cols, rows) -> Packed; UnsupportedModelError if unknown."""
    fmt = format_for(name, ggml_type, type_name)
    cols = shape[0]
    rows = 1
    for n in shape[1:]:
        rows *= n
    if cols % fmt.block_size or (fmt.block_size > 1 and cols % QBLOCK):
        raise UnsupportedModelError(f"tensor {name}: row length {cols} is not a multiple of "
                                    f"the {fmt.name} block size")
    expected = rows * cols // fmt.block_size * fmt.type_size
    if raw.size != expected:
        raise UnsupportedModelError(f"tensor {name}: {raw.size} bytes, expected {expected}")
    return fmt.unpack(raw, rows, cols)
