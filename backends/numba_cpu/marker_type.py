"""Marker types: Python objects whose whole content is known while Numba types a call.

An Isa (isa.py) or a TileKind (tile_kind.py) carries what it says in its Numba type, so jitted
code specializes on it and holds no run-time value for it: the model is opaque, unboxing gives
a dummy and boxing gives None.  register_marker does that registration once for any such pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import types
from numba.extending import NativeValue, box, models, register_model, typeof_impl, unbox


def register_marker(cls: type, type_cls: type[types.Type],
                    to_type: Callable[[Any], types.Type]) -> None:
    """Values of `cls` type as to_type(value), an instance of `type_cls`, with no data."""
    typeof_impl.register(cls)(lambda val, c: to_type(val))
    register_model(type_cls)(models.OpaqueModel)
    unbox(type_cls)(lambda typ, obj, c: NativeValue(c.context.get_dummy_value()))
    box(type_cls)(lambda typ, val, c: c.pyapi.make_none())
