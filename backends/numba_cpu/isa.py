"""Which instruction-set path the kernels take: chosen once per runner from the host's CPU
features (llvmlite reports them), overridable with LOCALINFER_ISA or the runner's `isa` argument.

    avx512   AVX-512 F/BW/VNNI + F16C: 16-row weight tiles, vpdpbusd, vector attention
    generic  plain Numba loops every machine can run (the reference the fast paths match)

The choice reaches the jitted step as an argument of a Numba type of its own (IsaType), whose
name selects the kernels at compile time (dispatch.py); each ISA compiles and caches its own
specialization of the one llama step.
"""

from __future__ import annotations

import os

from numba import types
from numba.extending import NativeValue, box, models, register_model, typeof_impl, unbox

from localinfer.errors import InvalidRequestError

ISA_ENV = "LOCALINFER_ISA"
# name -> host features it needs; best first
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512bw", "avx512vnni", "f16c"),
    "generic": (),
}


def host_features() -> set[str]:
    import llvmlite.binding as ll

    return {name for name, on in ll.get_host_cpu_features().items() if on}


def resolve_isa(requested: str | None = None) -> str:
    """`requested`, else $LOCALINFER_ISA, else the best path this host supports.

    Forcing a path the CPU lacks (or an unknown name) raises InvalidRequestError."""
    name = (requested or os.environ.get(ISA_ENV) or "auto").strip().lower()
    have = host_features()
    if name == "auto":
        return next(n for n, need in REQUIREMENTS.items() if all(f in have for f in need))
    if name not in REQUIREMENTS:
        raise InvalidRequestError(
            f"unknown ISA {name!r} (known: auto, {', '.join(REQUIREMENTS)})")
    missing = [f for f in REQUIREMENTS[name] if f not in have]
    if missing:
        raise InvalidRequestError(f"ISA {name!r} needs CPU features this host lacks: "
                                  f"{', '.join(missing)}")
    return name


class Isa:
    """A Python handle for an ISA name, passed to jitted code."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if name not in REQUIREMENTS:
            raise InvalidRequestError(f"unknown ISA {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"Isa({self.name!r})"


class IsaType(types.Type):
    def __init__(self, isa: str) -> None:
        self.isa = isa
        super().__init__(name=f"Isa({isa})")


@typeof_impl.register(Isa)
def _typeof_isa(val, c):
    return IsaType(val.name)


@register_model(IsaType)
class _IsaModel(models.OpaqueModel):
    pass


@unbox(IsaType)
def _unbox_isa(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


@box(IsaType)
def _box_isa(typ, val, c):
    return c.pyapi.make_none()
