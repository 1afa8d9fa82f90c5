"""`localinfer info MODEL`: what a GGUF file holds and what running it will need."""

from __future__ import annotations

import argparse

from localinfer.catalog import Catalog


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="catalog name or path to a .gguf file")


def main(name: str, args: argparse.Namespace) -> int:
    from localinfer.model_info import describe, format_info

    path = Catalog.load().resolve(args.model)
    print(format_info(describe(path)))
    return 0
