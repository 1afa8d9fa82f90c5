"""`localinfer eval MODEL_A MODEL_B [TEXTFILE]`: perplexity of both, KL(A‖B) and top-1
agreement over a text, computed with our engine (localinfer.quant.quality)."""

from __future__ import annotations

import argparse


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model_a", help="reference model (catalog name or .gguf), e.g. the F16 source")
    p.add_argument("model_b", help="model to compare against it, e.g. its quantization")
    p.add_argument("text", nargs="?", default=None,
                   help="UTF-8 text file (default: a built-in English sample, ~1k tokens)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--backend", choices=("auto", "numba", "llamacpp"), default="auto",
                   help="engine backend (auto: numba when it runs both models, else llama.cpp)")
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")


def main(name: str, args: argparse.Namespace) -> int:
    from localinfer.quant.quality import compare, read_text

    report = compare(args.model_a, args.model_b, read_text(args.text), ctx=args.ctx,
                     threads=args.threads, backend=args.backend,
                     progress=False if args.no_progress else None)
    print(report.format(args.model_a, args.model_b))
    return 0
