"""The NEON (AArch64 dot-product) kernel path: tests/arm64_neon_checks.py against gguf-py's
references, the generic kernels and exact attention, plus a tiny model's greedy decode.

On an aarch64 host the checks run in this process.  Elsewhere they run in one subprocess on
the arm64 python under qemu that tools/arm64_qemu.sh builds (ROOT/bin/python; ROOT from
LOCALINFER_ARM64_ROOT, default ~/.cache/localinfer/arm64-root).  Without that root the tests
skip, naming the command that builds it — unless LOCALINFER_REQUIRE_ARM64=1 (CI), where they
fail.  Emulated JIT is slow: the first run compiles for a few minutes, later runs load the
compiled kernels from the numba cache inside the root.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import arm64_neon_checks as checks
import pytest

REPO = Path(__file__).resolve().parents[1]
NATIVE = platform.machine().lower() in ("aarch64", "arm64")
ROOT = Path(os.environ.get("LOCALINFER_ARM64_ROOT",
                           Path.home() / ".cache" / "localinfer" / "arm64-root"))
EMULATED_TIMEOUT_S = 900  # the whole emulated run, cold numba cache included


def _cache_dir() -> Path:
    """The emulated run's numba cache, one per version of the backend's sources: numba checks
    only a cached function's own file, so code cached against an older callee (another file)
    would be reused stale — in this emulated setup that once crashed the loading process.
    Caches of older versions are removed (they live in the arm64 root, which is ours)."""
    h = hashlib.sha256()
    sources = [*(REPO / "backends" / "numba_cpu").rglob("*.py"),
               *(REPO / "tests").glob("arm64_*.py")]
    for f in sorted(sources):
        h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    caches = ROOT / "numba-cache"
    mine = caches / h.hexdigest()[:16]
    if caches.is_dir():
        for old in caches.iterdir():
            if old != mine:
                shutil.rmtree(old, ignore_errors=True)
    return mine


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    if NATIVE:
        pytest.importorskip("numba")
        return {r["name"]: r for r in checks.run(list(checks.CHECKS))}
    launcher = ROOT / "bin" / "python"
    if not launcher.exists():
        reason = (f"no arm64 python at {launcher}: build it with tools/arm64_qemu.sh "
                  f"(root, ~15 s, ~90 MB of downloads)")
        if os.environ.get("LOCALINFER_REQUIRE_ARM64") == "1":
            pytest.fail(f"LOCALINFER_REQUIRE_ARM64=1 but {reason}")
        pytest.skip(reason)
    # two emulator processes, one per core of a small CI machine (emulated compiling is
    # single-threaded): the matmul checks, and the rest; so no compile helper beside the tiny
    # model's first step (backends/numba_cpu/compile_ahead.py), which would be a third
    env = {**os.environ, "NUMBA_CACHE_DIR": str(_cache_dir()), "LOCALINFER_COMPILE_AHEAD": "0"}
    weights = [n for n in checks.CHECKS if n.startswith("weights_") or n == "instructions"]
    rest = [n for n in checks.CHECKS if n not in weights]
    deadline = time.monotonic() + EMULATED_TIMEOUT_S
    found, failures = {}, []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as files:
        runs = []
        for i, names in enumerate((weights, rest)):
            # output to files: a full pipe would stall a run until the other one ends
            out, err = (files.enter_context(open(Path(tmp) / f"{i}.{x}", "w+"))
                        for x in ("out", "err"))
            runs.append((subprocess.Popen(
                [str(launcher), str(REPO / "tests" / "arm64_neon_checks.py"), *names],
                stdout=out, stderr=err, text=True, cwd=REPO, env=env), out, err))
        try:
            for proc, _, _ in runs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc, _, _ in runs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for proc, out, err in runs:
            out.seek(0)
            err.seek(0)
            text = out.read()
            for line in text.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    found[r["name"]] = r
            if proc.returncode != 0:
                failures.append(f"exit {proc.returncode}:\n{text[-3000:]}\n{err.read()[-3000:]}")
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
