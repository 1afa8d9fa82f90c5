"""load_weights(): a model's repacked weights, from the repacked-weight cache when it has them.

The cache (localinfer/weight_cache.py) is keyed by the GGUF's content and by what else decides
the layout: the architecture (LlamaWeights or Gemma3Weights), the stack kind (WeightStack on the
generic path, TileStack on every SIMD one: avx2, avx512 and neon read the same tiles), and the
version below plus the digest of this package's sources (the repacking code lives here, as
the kernels do).  A hit maps the stored arrays and never reads the GGUF's tensors; a miss
repacks, releasing the file's pages role by role (weights.py), and stores the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer import weight_cache

from . import SOURCE_DIGEST
from .tile_kind import TileKind, with_markers
from .weights import LlamaWeights

if TYPE_CHECKING:
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig

    from .gemma3 import Gemma3Weights

# bump when the stored layout changes in a way the source digest would not catch
# (2: Q5_0 / Q5_1 roles in 5-bit tiles, TileStack kinds as TileKind; 3: roles of mixed
# kinds as SplitStacks, split_stack.py)
LAYOUT_VERSION = 3


def load_weights(g: GGUFFile, config: ModelConfig, tiled: bool
                 ) -> tuple[LlamaWeights | Gemma3Weights, bool]:
    """(the weights, True when they came from the cache)."""
    classes: tuple[type, ...] = (LlamaWeights,)
    if config.arch == "gemma3":
        from .gemma3 import Gemma3Weights

        classes = (LlamaWeights, Gemma3Weights)
    cls = classes[-1]
    family = f"{config.arch}-{'tiles' if tiled else 'stack'}"
    weights, hit = weight_cache.load_or_build(
        g.path, family, f"v{LAYOUT_VERSION}-{SOURCE_DIGEST}",
        lambda: cls.load(g, config, tiled=tiled), (*classes, TileKind))
    return with_markers(weights), hit  # stored with TileKinds, stepped with markers
