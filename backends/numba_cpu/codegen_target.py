"""What LLVM may emit when the AVX2 path is forced on a newer CPU.

`LOCALINFER_ISA=avx2 LOCALINFER_VNNI=0` measures the laptop path (AVX2 + FMA + F16C, no
AVX-512, no VNNI) on an AVX-512 machine.  Our kernels pick their instructions from the IsaType,
but Numba compiles for the host CPU, so LLVM still used AVX-512 where it saw a chance: it fused
vpmaddwd + vpaddd into vpdpwssd (AVX-512 VNNI), folded broadcasts into EVEX operands and had 32
vector registers instead of 16.  Measured on a Zen 4 host (SmolLM2, 2 threads): single-stream
decode 185 tok/s with the host's features against 144 with AVX2's, so the emulation flattered
the path it stands for.  When the environment forces that path, the process's code is therefore
compiled with every AVX-512 and VNNI feature off; the host's CPU name still sets the
scheduling model.  Numba reads the features once, when its code generator starts, and keys its
cache by them, so this runs before any kernel compiles or loads (backends/numba_cpu/__init__)
and the narrowed code has cache entries of its own.

Only the environment is consulted: a runner built with `isa="avx2"` in a process that also
runs other paths (the tests) keeps the host's features, and its results are the same bits.
"""

from __future__ import annotations

import os
import platform
import sys

ISA_ENV = "LOCALINFER_ISA"
VNNI_ENV = "LOCALINFER_VNNI"
FEATURES_ENV = "NUMBA_CPU_FEATURES"


def _off(name: str, vnni: bool) -> bool:
    """Features an AVX2 CPU (with 256-bit VNNI only where `vnni`) lacks."""
    if name.startswith(("avx512", "amx", "avx10")) or name == "evex512":
        return True
    return name.startswith("avxvnni") and not vnni


def narrowed_features(host: dict[str, bool], vnni: bool) -> str:
    """The host's LLVM feature string with what the AVX2 path may not use turned off."""
    return ",".join(("-" if (not on or _off(name, vnni)) else "+") + name
                    for name, on in sorted(host.items()))


def narrow_for_forced_isa() -> str | None:
    """Restrict Numba's target features when the environment forces the AVX2 path without
    VNNI on an x86 host that has more (AVX-512 or a VNNI); returns the feature string set, or
    None when nothing changes (another path, the host's own best, or the user set
    NUMBA_CPU_FEATURES)."""
    if os.environ.get(ISA_ENV, "").strip().lower() != "avx2":
        return None
    if os.environ.get(VNNI_ENV, "").strip() != "0" or FEATURES_ENV in os.environ:
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import llvmlite.binding as ll

    host = dict(ll.get_host_cpu_features().items())
    if not any(on and _off(name, False) for name, on in host.items()):
        return None  # an AVX2-only host: its own features already are the path's
    features = narrowed_features(host, vnni=False)
    os.environ[FEATURES_ENV] = features
    config = sys.modules.get("numba.core.config")
    if config is not None:  # numba already imported: its config read the environment then
        config.CPU_FEATURES = features
    return features
