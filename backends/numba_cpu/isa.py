"""Which instruction-set path the kernels take: chosen once per runner from the host's CPU
features (llvmlite reports them), overridable with LOCALINFER_ISA or the runner's `isa` argument.

    avx512   AVX-512 F/BW/VNNI + F16C: 16-row weight tiles, vpdpbusd, vector attention
    avx2     AVX2 + FMA + F16C: the same tiles as two 8-row halves in 256-bit vectors; integer
             dot products by vpdpbusd ymm where the host has AVX-VNNI (or AVX-512 VNNI + VL),
             else by the vpmaddubsw/vpmaddwd pair
    neon     AArch64 NEON + dot product (ARMv8.2-A dotprod): the 8-lane kernels' 8-row halves in
             pairs of 128-bit registers, integer dot products by SDOT (simd/neon.py)
    generic  plain Numba loops every machine can run (the reference the fast paths match)

The choice reaches the jitted step as an argument of a Numba type of its own (IsaType), whose
name selects the kernels at compile time (dispatch.py) and whose lane count sets their vector
width (simd/vectors.py); each ISA compiles and caches its own specialization of the one llama
step and of every kernel.
"""

from __future__ import annotations

import os
import platform

from numba import types

from localinfer.errors import InvalidRequestError

from .codegen_target import ISA_ENV, VNNI_ENV
from .marker_type import register_marker

# name -> host features it needs; best first
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512bw", "avx512vnni", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
    "neon": ("neon", "dotprod"),
    "generic": (),
}
# float32 lanes per vector on each path: the width the single-source kernels (simd/vectors.py)
# take from the IsaType at compile time; neon's 8 lanes are pairs of 128-bit registers, and
# generic has no vectors
LANES = {"avx512": 16, "avx2": 8, "neon": 8, "generic": 0}

# Linux AArch64 AT_HWCAP bits (asm/hwcap.h) -> LLVM feature names
AT_HWCAP = 16
HWCAP_BITS = {1 << 1: "neon", 1 << 10: "fullfp16", 1 << 20: "dotprod"}


def host_features() -> set[str]:
    import llvmlite.binding as ll

    have = {name for name, on in ll.get_host_cpu_features().items() if on}
    if platform.machine().lower() in ("aarch64", "arm64"):
        have |= arm_features()
    return have


def arm_features(hwcap: int | None = None, cpu: str | None = None) -> set[str]:
    """NEON extensions of an AArch64 host that Numba's code can use.

    LLVM's feature list leaves dotprod out even where the CPU has it (it parses only a few
    /proc/cpuinfo flags), so the kernel's hwcaps (`hwcap`: AT_HWCAP bits, read here when None)
    say what the CPU has; Apple silicon has all of these from M1 on.  Code is compiled for
    Numba's CPU name (`cpu`), so dotprod counts only when that is a named core, whose LLVM
    definition carries its extensions (NUMBA_CPU_NAME may name one, as the arm64 tests under
    qemu do), or NUMBA_CPU_FEATURES adds it: for "generic" LLVM would refuse to emit SDOT."""
    import llvmlite.binding as ll
    from numba.core import config

    if hwcap is None and platform.system() == "Darwin":
        caps = {"neon", "fullfp16", "dotprod"}
    else:
        if hwcap is None:
            import ctypes

            libc = ctypes.CDLL(None)
            libc.getauxval.restype = ctypes.c_ulong
            libc.getauxval.argtypes = [ctypes.c_ulong]
            hwcap = libc.getauxval(AT_HWCAP)
        caps = {name for bit, name in HWCAP_BITS.items() if hwcap & bit}
    cpu = cpu or config.CPU_NAME or ll.get_host_cpu_name()
    if cpu == "generic" and "+dotprod" not in (config.CPU_FEATURES or ""):
        caps.discard("dotprod")
    return caps


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


def host_has_vnni256(have: set[str] | None = None) -> bool:
    """vpdpbusd on 256-bit registers: AVX-VNNI (VEX), or AVX-512 VNNI with VL (EVEX)."""
    have = host_features() if have is None else have
    return "avxvnni" in have or {"avx512vnni", "avx512vl"} <= have


def vnni_choice() -> bool:
    """Whether the avx2 path uses vpdpbusd ymm: $LOCALINFER_VNNI=0 forces the vpmaddubsw pair
    (what an AVX2 CPU without VNNI runs, to measure that path on a newer one), 1 asks for
    VNNI (an error where the host lacks it); unset: whatever the host has."""
    want = os.environ.get(VNNI_ENV, "").strip()
    if want not in ("", "0", "1"):
        raise InvalidRequestError(f"{VNNI_ENV} must be 0 or 1, not {want!r}")
    if want == "1" and not host_has_vnni256():
        raise InvalidRequestError(f"{VNNI_ENV}=1: this CPU has no 256-bit VNNI "
                                  "(AVX-VNNI, or AVX-512 VNNI + VL)")
    return host_has_vnni256() if want == "" else want == "1"


class Isa:
    """A Python handle for an ISA name, passed to jitted code.  `vnni` (avx2 only): use
    vpdpbusd ymm; None = whatever the host has (False forces the vpmaddubsw pair, for tests).
    neon has one dot product (SDOT), so vnni stays False there."""

    __slots__ = ("name", "vnni")

    def __init__(self, name: str, vnni: bool | None = None) -> None:
        if name not in REQUIREMENTS:
            raise InvalidRequestError(f"unknown ISA {name!r}")
        self.name = name
        if name == "avx2":
            self.vnni = vnni_choice() if vnni is None else vnni
        else:
            self.vnni = name == "avx512"

    @property
    def token_group(self) -> int:
        """ModelRunner.token_group on this path.  With vpdpbusd (avx512, avx2 + VNNI) a step
        of 4 tokens costs less than one of 3 (Qwen2.5-Coder-1.5B, 2 cores of a Zen 5, tokens
        1-4 over 1: AVX-512 1.00/1.11/1.22/1.09x, avx2 + VNNI 1.00/1.40/1.60/1.48x): the
        first 4-row pass over a tile hides its work under the weights' reads, where a
        remainder of 2-3 rows takes a 1-row pass each.  On the vpmaddubsw pair 4 rows cost
        what 3 do (1.27/1.65/1.58x) and guesses filled up to 4 measured no better; generic and
        neon are not measured: 1."""
        return 4 if self.vnni else 1

    def __repr__(self) -> str:
        return f"Isa({self.name!r}, vnni={self.vnni})"


class IsaType(types.Type):
    def __init__(self, isa: str, vnni: bool = False) -> None:
        self.isa = isa
        self.vnni = vnni
        self.lanes = LANES[isa]
        suffix = "+vnni" if vnni and isa == "avx2" else ""
        super().__init__(name=f"Isa({isa}{suffix})")


register_marker(Isa, IsaType, lambda val: IsaType(val.name, val.vnni))
