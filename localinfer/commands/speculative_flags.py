"""The speculative-decoding flags shared by run, chat, serve and bench."""

from __future__ import annotations

import argparse
from typing import Any

from localinfer.errors import InvalidRequestError


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", metavar="ngram|MODEL",
                   help="guess tokens and verify them in the same step: 'ngram' looks the "
                        "text's last tokens up in the prompt and output (fast when the reply "
                        "repeats its input: code edits, extraction); MODEL (catalog name or "
                        ".gguf path) is a smaller draft model with the same vocabulary that "
                        "guesses greedily while it is confident. Greedy output is unchanged")
    p.add_argument("--num-speculative-tokens", type=int, metavar="K",
                   help="most tokens a sequence guesses per step (default 8; it adapts "
                        "below that to how many are accepted)")


def speculative_options(args: argparse.Namespace) -> dict[str, Any]:
    """LLM keywords for the flags, checked before any model loads."""
    from localinfer.engine.config import EngineConfig

    spec, k = args.speculative, args.num_speculative_tokens
    if k is not None and spec is None:
        raise InvalidRequestError("--num-speculative-tokens needs --speculative")
    if spec is None:
        return {}
    EngineConfig(speculative=spec, **({} if k is None else {"num_speculative_tokens": k}))
    return {"speculative": spec, "num_speculative_tokens": k}
