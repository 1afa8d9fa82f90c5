"""The NEON (AArch64 dot-product) kernel path: tests/arm64_neon_checks.py against gguf-py's
references, the generic kernels and exact attention, plus a tiny model's greedy decode.

On an aarch64 host the checks run in this process.  Elsewhere they run in two subprocesses
on the arm64 python under qemu that tools/arm64_qemu.sh builds (ROOT/bin/python; ROOT from
LOCALINFER_ARM64_ROOT, default ~/.cache/localinfer/arm64-root), started in the background of
the session (tests/arm64_emulated.py).  Without that root the tests skip, naming the command
that builds it — unless LOCALINFER_REQUIRE_ARM64=1 (CI), where they fail.  Emulated JIT is
slow: the first run compiles for many minutes, later runs load the compiled kernels from the
numba cache inside the root.
"""

from __future__ import annotations

import os
import subprocess
import sys

import arm64_emulated as emulated
import arm64_neon_checks as checks
import pytest


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    if emulated.NATIVE:
        pytest.importorskip("numba")
        return {r["name"]: r for r in checks.run(list(checks.CHECKS))}
    if not emulated.LAUNCHER.exists():
        reason = (f"no arm64 python at {emulated.LAUNCHER}: build it with tools/arm64_qemu.sh "
                  f"(root, ~15 s, ~90 MB of downloads)")
        if os.environ.get("LOCALINFER_REQUIRE_ARM64") == "1":
            pytest.fail(f"LOCALINFER_REQUIRE_ARM64=1 but {reason}")
        pytest.skip(reason)
    # started by conftest.py when collection selected these tests (in the session's idle
    # time); else now
    found, failures = emulated.start().collect()
    if failures:
        pytest.fail("arm64 checks: " + "\n".join(failures))
    return found


@pytest.mark.parametrize("name", list(checks.CHECKS))
def test_neon(results, name):
    r = results.get(name)
    assert r is not None, f"check {name} did not run"
    assert r["ok"], r["error"]


def test_greedy_decode_matches_the_generic_path(results):
    """The tiny model's NEON decode (on arm64) against the generic path's on this host: the
    same tokens, logits equal to rounding (the int8 dot products are exact on both; sums of
    floats may group differently across machines)."""
    import numpy as np

    neon = results["greedy_decode"]["value"]
    assert neon is not None, results["greedy_decode"]["error"]
    ref = checks.greedy_decode("generic")
    assert neon["tokens"] == ref["tokens"]
    got, want = np.array(neon["logits"]), np.array(ref["logits"])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_checks_cover_every_weight_type_the_backend_reads():
    from localinfer.backends.numba_cpu.quants import FORMATS

    assert {f.name for f in FORMATS.values()} == set(checks.TYPES)


def test_neon_modules_import_harmlessly_on_any_host():
    """Importing the dispatch (which wires neon to the single-source kernels at 8 lanes, with
    simd/neon.py's SDOT lowering) compiles nothing on an x86 host."""
    code = ("import localinfer.backends.numba_cpu.dispatch, "
            "localinfer.backends.numba_cpu.simd.neon, "
            "localinfer.backends.numba_cpu.kernels.matmul_tiles as m; "
            "assert not m.matmul_tiles.signatures")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
