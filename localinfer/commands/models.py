"""`localinfer pull | list | rm`: the local model cache."""

from __future__ import annotations

import argparse

from localinfer.catalog import Catalog


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "pull":
        p.add_argument("name", nargs="?", help="catalog model name (default: the default model)")
        p.add_argument("--force", action="store_true", help="download again even if present")
    elif name == "rm":
        p.add_argument("name", help="catalog model name")


def main(name: str, args: argparse.Namespace) -> int:
    catalog = Catalog.load()
    if name == "pull":
        model = args.name or catalog.default
        path = catalog.pull(model, progress=True, force=args.force)
        print(f"{model}: {path}")
    elif name == "rm":
        if catalog.remove(args.name):
            print(f"removed {args.name}")
        else:
            print(f"{args.name} is not pulled")
    else:
        print(f"{'NAME':<22} {'ARCH':<8} {'SIZE':>9}  {'PULLED':<6} DESCRIPTION")
        for row in catalog.rows():
            size = f"{row['size'] / 1e6:.0f} MB" if row["size"] else "?"
            mark = "*" if row["default"] else " "
            print(
                f"{row['name'] + mark:<22} {row['architecture']:<8} {size:>9}  "
                f"{'yes' if row['pulled'] else 'no':<6} {row['description']}"
            )
        print(f"(* default; cache: {catalog.models_dir})")
    return 0
