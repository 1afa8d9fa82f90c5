"""kv_zeros(): a zeroed KV pool whose memory is committed page by page, as blocks are written.

NumPy advises the kernel to back large arrays with 2 MB transparent huge pages.  The pools are
(n_layers, num_blocks, ...) arrays, so the first tokens of a sequence write one block in every
layer's region, and with huge pages each such write commits 2 MB: a single short request
faulted in most of a 4096-token pool.  An anonymous private mapping of our own gets no such
advice, so only the 4 KB pages of blocks actually written count.  The pages come zeroed; the
array is a plain writable ndarray, so the kernels see the same type as before.
"""

from __future__ import annotations

import math
import mmap

import numpy as np


def kv_zeros(shape: tuple[int, ...], dtype: type = np.uint16) -> np.ndarray:
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, dtype)
    nbytes = count * np.dtype(dtype).itemsize
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype, count).reshape(shape)
