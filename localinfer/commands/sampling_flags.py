"""The sampling flags shared by run and chat; unset flags take the model's recommendation.

Each flag defaults to None, so an explicit value (even one equal to a default) is told apart
from "not given" and overrides only its own key (sampling_defaults.py).
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT = "default: the model's recommended setting, else llama.cpp's"


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", "-t", type=float,
                   help=f"sampling temperature; 0 = greedy ({DEFAULT}, 0.8)")
    p.add_argument("--top-k", type=int,
                   help=f"keep the k likeliest tokens; 0 = off ({DEFAULT}, 40)")
    p.add_argument("--top-p", type=float, help=f"nucleus sampling; 1 = off ({DEFAULT}, 0.95)")
    p.add_argument("--min-p", type=float,
                   help=f"drop tokens below min-p x the top probability ({DEFAULT}, 0.05)")
    p.add_argument("--repeat-penalty", type=float,
                   help=f"penalty for recently seen tokens; 1 = off ({DEFAULT}, 1.0)")


def sampling_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams field -> the flag's value, None where the flag was not given."""
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "min_p": args.min_p, "repetition_penalty": args.repeat_penalty}
