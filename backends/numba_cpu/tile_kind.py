"""TileKind: the layout kind of a TileStack (weights.py), carried in its Numba type.

A TileStack's first element says which kind (quants/packed.py: KIND_Q4, KIND_Q5, KIND_Q8,
KIND_F32) its tiles hold.  It is a TileKind rather than an int so that the kind is known while
typing: the projection of each role (dispatch.py) and matmul_tiles / embed_tiles compile only
the loop of their own code width, so a first run compiles the widths the model uses and no
other (a model without Q5_0 / Q5_1 weights never compiles the 5-bit loop), as
project_q8k.project_as does for the q8_K path.  Inside jitted code, kind_of gives the kind as
a constant, which LLVM folds out of every branch on it.

A TileKind is a dataclass, so the repacked-weight cache stores it (cached_weights.py names the
class for reading it back).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .marker_type import register_marker


@dataclass(frozen=True, slots=True)
class TileKind:
    kind: int  # quants.packed KIND_*


class TileKindType(types.Type):
    def __init__(self, kind: int) -> None:
        self.kind = kind
        super().__init__(name=f"TileKind({kind})")


register_marker(TileKind, TileKindType, lambda val: TileKindType(val.kind))


def stack_kind(ws) -> int | None:
    """While typing: the kind of a TileStack tuple type (None for anything else, such as the
    generic path's WeightStack, whose kind is a run-time int)."""
    first = ws.types[0] if isinstance(ws, types.BaseTuple) and len(ws.types) else None
    return first.kind if isinstance(first, TileKindType) else None


@intrinsic
def kind_of(typingctx, kind):
    """The kind of a TileKind, as a compile-time constant."""
    if not isinstance(kind, TileKindType):
        raise TypingError(f"expected a TileKind, not {kind}")
    value = kind.kind
    return types.int64(kind), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(64), value)
