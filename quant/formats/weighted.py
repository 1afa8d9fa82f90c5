"""Importance-weighted quantization: ggml's quantize_row_*_impl paths, taken when an importance
matrix is given (llama.cpp passes `quant_weights`, one float per column). Same float32
operation order as ggml-quants.c, so the bytes match llama.cpp's given the same imatrix.

The searches live in weighted_search.py, the kernels in weighted_legacy.py (Q4_0, Q4_1, Q5_0,
Q5_1) and weighted_kquant.py (Q2_K .. Q6_K); Q8_0 and the float types ignore the imatrix in ggml.
"""

from __future__ import annotations

from .weighted_kquant import (
    quantize_q2_k_w,
    quantize_q3_k_w,
    quantize_q4_k_w,
    quantize_q5_k_w,
    quantize_q6_k_w,
)
from .weighted_legacy import quantize_q4_0_w, quantize_q4_1_w, quantize_q5_0_w, quantize_q5_1_w

# ggml type id -> weighted kernel
WEIGHTED = {2: quantize_q4_0_w, 3: quantize_q4_1_w, 6: quantize_q5_0_w, 7: quantize_q5_1_w,
            10: quantize_q2_k_w, 11: quantize_q3_k_w, 12: quantize_q4_k_w, 13: quantize_q5_k_w,
            14: quantize_q6_k_w}
# types whose ggml quantizer ignores the importance matrix
IGNORES_IMATRIX = {0, 1, 8, 30}  # F32, F16, Q8_0, BF16
