"""`localinfer bundle create | verify | install | extract`: offline demo bundles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localinfer.errors import BundleError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bundle_command", metavar="ACTION")
    sub.required = True
    c = sub.add_parser("create", help="build a bundle: wheels, models, launchers, manifest")
    c.add_argument("out", type=Path, help="the bundle folder to make (or archive, --archive)")
    c.add_argument("--model", "-m", action="append", default=[],
                   help="catalog name or .gguf path (repeatable; the first is the default; "
                        "default: the catalog's default model)")
    c.add_argument("--platform", action="append", default=[],
                   help="host (default), linux-x86_64, linux-aarch64, macos-arm64, "
                        "windows-amd64 (repeatable or comma-separated)")
    c.add_argument("--python", action="append", default=[],
                   help="target Python versions, e.g. 3.10,3.11 (default: this one's)")
    c.add_argument("--extras", default="server,tui",
                   help="localinfer extras to include (default: server,tui; '' for none)")
    c.add_argument("--prompts", type=Path, help="demo prompts: one per line, or a JSON list")
    c.add_argument("--system", help="system prompt for the demo prompts and the launchers")
    c.add_argument("--max-tokens", type=int, default=32,
                   help="tokens recorded per demo prompt (default: 32)")
    c.add_argument("--archive", choices=["zip", "tar"],
                   help="write OUT.zip or OUT.tar instead of a folder")
    v = sub.add_parser("verify", help="check a bundle's files (and with --smoke, its answers)")
    v.add_argument("path", type=Path, help="a bundle folder, .zip or .tar")
    v.add_argument("--smoke", action="store_true",
                   help="also run the demo prompts and compare the tokens with the recorded")
    v.add_argument("--skip-check", action="store_true", help=argparse.SUPPRESS)
    i = sub.add_parser("install", help="the bundle's models into the model cache and catalog")
    i.add_argument("path", type=Path, help="a bundle folder, .zip or .tar")
    i.add_argument("--skip-check", action="store_true", help=argparse.SUPPRESS)
    x = sub.add_parser("extract", help="unpack a bundle archive, refusing unsafe entries")
    x.add_argument("archive", type=Path, help="a bundle .zip or .tar")
    x.add_argument("dest", type=Path, help="an empty or new folder")


def main(name: str, args: argparse.Namespace) -> int:
    action = args.bundle_command
    if action == "create":
        from localinfer.bundle.create import CreateOptions, create

        if args.max_tokens < 1:
            raise BundleError(f"invalid --max-tokens {args.max_tokens}")
        extras = [e.strip() for e in args.extras.split(",") if e.strip()]
        out = create(CreateOptions(out=args.out, models=args.model, platforms=args.platform,
                                   pythons=args.python, extras=extras,
                                   prompts_file=args.prompts, system=args.system,
                                   archive=args.archive, max_tokens=args.max_tokens))
        print(out)
    elif action == "verify":
        from localinfer.bundle.verify import verify

        found = verify(args.path, smoke=args.smoke, skip_check=args.skip_check)
        for line in found:
            print(f"bundle verify: {line}", file=sys.stderr)
        if found:
            print(f"bundle verify: {args.path}: {len(found)} problem(s)", file=sys.stderr)
            return 1
        print(f"{args.path}: ok" + (" (files and demo tokens)" if args.smoke else ""))
    elif action == "install":
        from localinfer.bundle.install import install

        for model in install(args.path, skip_check=args.skip_check):
            print(f"{model}: localinfer run --model {model} \"...\"")
    else:
        from localinfer.bundle.archive import extract
        from localinfer.bundle.opened import check_archive

        check_archive(args.archive)
        print(extract(args.archive, args.dest))
    return 0
