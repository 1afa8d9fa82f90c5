"""`localinfer run PROMPT`: one-shot generation streamed to stdout."""

from __future__ import annotations

import argparse
import os
import sys
import time

from localinfer.commands.backend_flags import add_backend_arguments, backend_options
from localinfer.commands.structured_flags import add_structured_arguments, structured_output
from localinfer.errors import InvalidRequestError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", help="the prompt ('-' or omitted: read stdin)")
    p.add_argument("--model", "-m", help="catalog name or path to a .gguf file")
    add_backend_arguments(p)
    p.add_argument("--max-tokens", "-n", type=int, default=256)
    p.add_argument("--temperature", "-t", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--system", default=os.environ.get("LOCALINFER_SYSTEM") or None,
                   help="system prompt (default: $LOCALINFER_SYSTEM, which a bundle's "
                        "launcher sets)")
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt as is")
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--ctx", type=int, help="context length (default: 4096, at most the model's)")
    p.add_argument("--kv-cache-mb", type=float, help="KV cache budget (default: 2 full contexts)")
    p.add_argument("--stats", action="store_true", help="print TTFT and tok/s afterwards")
    add_structured_arguments(p)


def main(name: str, args: argparse.Namespace) -> int:
    from localinfer.llm import LLM, GenerationResult
    from localinfer.sampling_params import SamplingParams

    prompt = args.prompt
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():
            raise InvalidRequestError("no prompt given (pass it as an argument or on stdin)")
        prompt = sys.stdin.read()
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repeat_penalty,
        seed=args.seed,
        stop=args.stop,
        structured=structured_output(args),
    )
    llm = LLM(args.model, backend=args.backend, threads=args.threads, max_model_len=args.ctx,
              kv_cache_mb=args.kv_cache_mb, progress=True,
              backend_options=backend_options(args))
    if not args.raw and llm.chat_template.is_fallback:
        print("note: the model has no chat template; using the prompt as plain text",
              file=sys.stderr)
    request = llm.request(prompt, args.system, raw=args.raw)
    start = time.perf_counter()
    result = GenerationResult()
    try:
        for out in llm.stream(request, params):
            result.add(out, start)
            if out.text:
                sys.stdout.write(out.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.stats:
            print(result.summary(), file=sys.stderr)
    finally:
        llm.close()
    return 0
