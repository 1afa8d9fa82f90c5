"""--json-schema / --json-object / --regex / --grammar / --choice: a StructuredOutput from flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.errors import InvalidRequestError

if TYPE_CHECKING:
    from localinfer.structured import StructuredOutput


def add_structured_arguments(p: argparse.ArgumentParser) -> None:
    so = p.add_mutually_exclusive_group()
    so.add_argument("--json-schema", metavar="FILE|JSON",
                    help="constrain the output to this JSON Schema (a file or inline JSON)")
    so.add_argument("--json-object", action="store_true", help="output any JSON object")
    so.add_argument("--regex", metavar="RE", help="output text matching this regex")
    so.add_argument("--grammar", metavar="FILE", help="output text in this Lark grammar "
                    "(llguidance's dialect)")
    so.add_argument("--choice", metavar="A,B,...", help="output exactly one of these strings")


def structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """The constraint the --json-schema/--json-object/--regex/--grammar/--choice flags ask."""
    from localinfer.structured import StructuredOutput

    if args.json_schema is not None:
        text = args.json_schema
        if not text.lstrip().startswith("{"):
            text = read_text(text, "--json-schema")
        return StructuredOutput(json=text)
    if args.json_object:
        return StructuredOutput(json_object=True)
    if args.regex is not None:
        return StructuredOutput(regex=args.regex)
    if args.grammar is not None:
        return StructuredOutput(grammar=read_text(args.grammar, "--grammar"))
    if args.choice is not None:
        return StructuredOutput(choice=[c for c in args.choice.split(",") if c])
    return None


def read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"{flag}: cannot read {path}: {exc.strerror}") from exc
