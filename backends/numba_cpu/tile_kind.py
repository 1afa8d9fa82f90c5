"""TileKind: the layout kind of a TileStack (weights.py), carried in its Numba type.

A TileStack's first element says which kind (quants/packed.py: KIND_Q4, KIND_Q5, KIND_Q8,
KIND_F32) its tiles hold.  It is a TileKind rather than an int so that the kind is known while
typing: the projection of each role (dispatch.py) and matmul_tiles / embed_tiles compile only
the loop of their own code width, so a first run compiles the widths the model uses and no
other (a model without Q5_0 / Q5_1 weights never compiles the 5-bit loop), as
project_q8k.project_as does for the q8_K path.  Inside jitted code, kind_of gives the kind as
a constant, which LLVM folds out of every branch on it.

A TileKind is a dataclass, so the repacked-weight cache stores it (cached_weights.py names the
class for reading it back).  What the step is given is its kind's marker instead (with_markers):
Numba's dispatcher types an argument in C when it can fingerprint it (numbers, arrays, tuples of
them, namedtuples by class name) and calls Python's typeof otherwise, for the whole tuple that
holds it: a TileKind made each weight tuple cost ~90 us of typing per step (0.5 ms of a 5 ms
SmolLM2 decode).  A marker is an instance of a field-less namedtuple class of its own per kind,
which the C fingerprint tells apart by name and which types as the same TileKindType.
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, typeof_impl

from .marker_type import register_marker


@dataclass(frozen=True, slots=True)
class TileKind:
    kind: int  # quants.packed KIND_*
    # the stack's m holds mins (w = d * (code - zero) + m), else m is empty; known while
    # typing, so a kernel's per-block formula has no run-time test of it, and a kind with
    # mins has zero 0 (Q4_1, Q5_1), so its code offset folds away too
    mins: bool = False


class TileKindType(types.Type):
    def __init__(self, kind: int, mins: bool = False) -> None:
        self.kind = kind
        self.mins = mins
        super().__init__(name=f"TileKind({kind}{'+m' if mins else ''})")


register_marker(TileKind, TileKindType, lambda val: TileKindType(val.kind, val.mins))

_MARKERS: dict[tuple[int, bool], tuple] = {}


def marker(kind: int, mins: bool = False) -> tuple:
    """The step's stand-in for TileKind(kind, mins): it types as TileKindType(kind, mins)."""
    key = (kind, mins)
    if key not in _MARKERS:
        # no fields: the class name is the kind
        cls = namedtuple(f"LocalinferTileKind{kind}{'M' if mins else ''}", ())
        typeof_impl.register(cls)(lambda val, c, k=kind, mm=mins: TileKindType(k, mm))
        _MARKERS[key] = cls()
    return _MARKERS[key]


def with_markers(tree: Any, _seen: dict[int, Any] | None = None) -> Any:
    """A weights dataclass (or a tuple of them) with every TileStack's TileKind replaced by
    marker(kind); objects met twice (a tied head) stay one object."""
    seen = {} if _seen is None else _seen
    if id(tree) in seen:
        return seen[id(tree)]
    out = tree
    if isinstance(tree, tuple) and tree and isinstance(tree[0], TileKind):
        out = (marker(tree[0].kind, tree[0].mins), *tree[1:])
    elif isinstance(tree, tuple):
        out = tuple(with_markers(x, seen) for x in tree)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        changes = {f.name: with_markers(getattr(tree, f.name), seen)
                   for f in dataclasses.fields(tree)}
        out = dataclasses.replace(tree, **changes)
    seen[id(tree)] = out
    return out


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


@intrinsic
def has_mins(typingctx, kind):
    """Whether a TileKind's stack has mins, as a compile-time constant."""
    if not isinstance(kind, TileKindType):
        raise TypingError(f"expected a TileKind, not {kind}")
    value = int(kind.mins)
    return types.boolean(kind), lambda ctx, builder, sig, args: ir.Constant(ir.IntType(1), value)


# Not a weight layout: 5-bit codes unpacked to one byte each, one part's groups in a row
# (matmul_tiles decodes a part's codes once when many activation rows pass over them)
KIND_CODES5 = 105


@intrinsic
def decoded_kind(typingctx, kind):
    """The kind of a part's decoded 5-bit codes (KIND_CODES5, the same mins)."""
    if not isinstance(kind, TileKindType):
        raise TypingError(f"expected a TileKind, not {kind}")
    return TileKindType(KIND_CODES5, kind.mins)(kind), (
        lambda ctx, builder, sig, args: ctx.get_dummy_value())
