"""The `localinfer` command: one argparse dispatcher; each subcommand's module loads lazily."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from localinfer.errors import LocalInferError

# subcommand -> (module under localinfer.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "generate a reply to one prompt and stream it to stdout"),
    "chat": ("chat", "chat with a model in the terminal (a Textual app; --plain for a REPL)"),
    "pull": ("models", "download a catalog model into the local cache"),
    "list": ("models", "list catalog models and which are pulled"),
    "rm": ("models", "remove a pulled model from the cache"),
    "info": ("info", "describe a GGUF model: architecture, sizes, tensor types, memory"),
    "serve": ("serve", "serve an OpenAI-compatible HTTP API (chat, completions, metrics)"),
    "ps": ("ps", "list the models a running server has loaded (memory, KV use, requests)"),
    "stop": ("ps", "unload a model from a running server"),
    "bench": ("bench", "benchmark localinfer against llama.cpp on the same model and threads"),
    "quantize": ("quantize", "quantize a GGUF model (byte-identical to llama.cpp's quantizer)"),
    "eval": ("eval", "compare two models on a text: perplexity, KL divergence, top-1 agreement"),
    "imatrix": ("imatrix", "compute an importance matrix for quantization (llama.cpp's format)"),
    "bundle": ("bundle", "offline bundles: wheels, models and launchers that run with no network"),
    "fuzz": ("fuzz", "fuzz the HTTP API (schemathesis) or the GGUF reader, bounded in time"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, the other subcommands are listed but get no arguments,
    so their modules (and what they import: the server, the bench, ...) are not loaded."""
    parser = argparse.ArgumentParser(
        prog="localinfer", description="CPU-first local LLM inference on GGUF models."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
        if only is None or name == only:
            _module(module).add_arguments(name, p)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand argv names (its first word that is not an option), if it is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _module(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"localinfer.commands.{name}")


def _version() -> str:
    from localinfer import __version__

    return f"localinfer {__version__}"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # a start builds only the named subcommand's arguments (~0.1 s of imports saved)
    args = build_parser(_command_in(words)).parse_args(words)
    debug = args.debug or bool(os.environ.get("LOCALINFER_DEBUG"))
    module, _ = COMMANDS[args.command]
    try:
        return int(_module(module).main(args.command, args) or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `| head`); nothing left to report
        sys.stderr.close()
        return 141
    except (LocalInferError, OSError) as exc:
        if debug:
            raise
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"localinfer: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
