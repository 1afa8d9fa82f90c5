"""Numba kernels: every function here is @njit(cache=True, nogil=True) and works on one step's
preallocated buffers.  Parallel loops run over output tiles or (token, kv head) pairs, and every
per-token result is computed by the same code in the same order whatever the batch holds, so a
sequence's logits do not depend on its batch neighbours (batch invariance)."""
