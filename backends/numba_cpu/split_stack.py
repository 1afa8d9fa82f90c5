"""SplitStack: one weight role stored as two TileStacks when its layers need different kinds.

llama.cpp's K-quant mixes give a role's layers different types: Q4_K_M files keep ffn_down
and attn_v in Q6_K on every other layer and in Q4_K (or Q5_0) on the rest.  One TileStack
holds one kind (the kind is in its Numba type), so such a role used to be stored whole in the
widest kind, 8-bit: every Q4_K layer of qwen2.5-coder-0.5b's ffn_down read twice the bytes it
needs and ran the 8-bit loop, which on the AVX2 pair costs two multiplies per 32 products
(the sign trick, simd/dot.py) where the 4- and 5-bit loops cost one.  Split, each layer runs
the loop of its own kind, bit for bit the result it had in the wider one (every kind converts
exactly into a wider one, quants/packed.py).

    (wide, narrow, where)
wide and narrow are TileStacks over the layers of each group; where (n_layers,) int64 is a
layer's index in wide (>= 0) or -1 - its index in narrow.  project_q8k.project_as takes
either form; a role whose layers share a kind stays a plain TileStack (one kernel compiled).
The generic path keeps one WeightStack per role: it has no per-kind loops to gain from.
"""

from __future__ import annotations

import numpy as np
from numba import types

from .quants.packed import WIDTH


def split_tiles(lazy, stack_tiles) -> tuple:
    """A TileStack of lazy's layers (weights.LazyLayers), or a SplitStack where the layers'
    own kinds differ: the layers of the widest kind in one stack, the rest in another."""
    kind = lazy.kind(tiled=True)
    own = [lazy.subset([i]).kind(tiled=True) for i in range(len(lazy))]
    wide = [i for i, k in enumerate(own) if k == kind]
    narrow = [i for i, k in enumerate(own) if k != kind]
    rest = lazy.subset(narrow).kind(tiled=True) if narrow else kind
    if not narrow or WIDTH[rest] >= WIDTH[kind]:  # one kind (or no narrower one) fits all
        return stack_tiles(lazy, kind=kind)
    where = np.empty(len(lazy), np.int64)
    where[wide] = np.arange(len(wide))
    where[narrow] = -1 - np.arange(len(narrow))
    return (stack_tiles(lazy.subset(wide), kind=kind),
            stack_tiles(lazy.subset(narrow), kind=rest), where)


def is_split(ws) -> bool:
    """While typing: whether ws is a SplitStack tuple type (TileStacks are 6-tuples,
    the generic path's WeightStacks 7-tuples)."""
    return (isinstance(ws, types.BaseTuple) and len(ws.types) == 3
            and isinstance(ws.types[2], types.Array))
