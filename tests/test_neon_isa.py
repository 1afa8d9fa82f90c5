"""Choosing the NEON path (isa.py) from an AArch64 host's features, on any host."""

from __future__ import annotations

import pytest

pytest.importorskip("numba")
from localinfer.backends.numba_cpu import isa as isa_mod  # noqa: E402
from localinfer.backends.numba_cpu.isa import HWCAP_BITS, Isa, arm_features, resolve_isa  # noqa: E402

from localinfer.errors import InvalidRequestError  # noqa: E402

ASIMD, ASIMDHP, ASIMDDP = (bit for bit, name in sorted(HWCAP_BITS.items()))


def test_auto_picks_neon_where_the_host_has_dotprod(monkeypatch):
    monkeypatch.delenv("LOCALINFER_ISA", raising=False)
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"neon", "dotprod", "fullfp16"})
    assert resolve_isa() == "neon"
    assert resolve_isa("neon") == "neon"
    assert resolve_isa("generic") == "generic"
    monkeypatch.setenv("LOCALINFER_ISA", "generic")
    assert resolve_isa() == "generic"
    monkeypatch.delenv("LOCALINFER_ISA")
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"neon"})  # ARMv8.0: no SDOT
    assert resolve_isa() == "generic"
    with pytest.raises(InvalidRequestError, match="dotprod"):
        resolve_isa("neon")
    assert Isa("neon").vnni is False


def test_forcing_neon_on_an_x86_host_fails_clearly(monkeypatch):
    monkeypatch.setattr(isa_mod, "host_features", lambda: {"avx2", "fma", "f16c"})
    with pytest.raises(InvalidRequestError, match="neon, dotprod"):
        resolve_isa("neon")
    assert resolve_isa() == "avx2"


def test_hwcaps_map_to_llvm_feature_names():
    assert arm_features(ASIMD | ASIMDHP | ASIMDDP, "neoverse-n1") == {
        "neon", "fullfp16", "dotprod"}
    assert arm_features(ASIMD, "cortex-a72") == {"neon"}
    # LLVM compiling for "generic" cannot emit SDOT, whatever the CPU has
    assert arm_features(ASIMD | ASIMDDP, "generic") == {"neon"}
