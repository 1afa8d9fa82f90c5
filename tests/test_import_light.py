"""`import localinfer` must not drag in heavy optional dependencies (DESIGN.md)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numba", "torch", "llama_cpp", "textual", "fastapi", "llvmlite", "jinja2", "ray")


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


def test_a_command_builds_only_its_own_arguments() -> None:
    """`localinfer run ...` parses without loading the other subcommands' modules (the server,
    the bench, the quantizer): part of a warm start's budget."""
    code = (
        "import sys\nfrom localinfer.cli import build_parser, _command_in\n"
        "args = build_parser(_command_in(['--debug', 'run', '-m', 'x', 'hi']))"
        ".parse_args(['run', '-m', 'x', 'hi'])\n"
        "assert args.command == 'run' and args.prompt == 'hi', args\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('localinfer.')"
        " and m.split('.')[1] in ('server', 'bench', 'quant', 'bundle', 'tui'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
