"""`import localinfer` must not drag in heavy optional dependencies (DESIGN.md)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numba", "torch", "llama_cpp", "textual", "fastapi", "llvmlite", "jinja2")


def test_import_localinfer_is_light() -> None:
    code = (
        "import sys, localinfer, localinfer.cli, localinfer.catalog, localinfer.backend\n"
        "from localinfer import SamplingParams\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"


def test_cli_help_is_light() -> None:
    code = (
        "import sys\nfrom localinfer.cli import build_parser\nbuild_parser()\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
