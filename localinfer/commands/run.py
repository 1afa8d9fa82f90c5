"""`localinfer run PROMPT`: one-shot generation streamed to stdout."""

from __future__ import annotations

import argparse
import os
import sys
import time

from localinfer.commands.backend_flags import add_backend_arguments, backend_options
from localinfer.commands.sampling_flags import add_sampling_arguments, sampling_overrides
from localinfer.commands.speculative_flags import add_speculative_arguments, speculative_options
from localinfer.commands.structured_flags import add_structured_arguments, structured_output
from localinfer.errors import InvalidRequestError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", help="the prompt ('-' or omitted: read stdin)")
    p.add_argument("--model", "-m", help="catalog name or path to a .gguf file")
    add_backend_arguments(p)
    p.add_argument("--max-tokens", "-n", type=int, default=256)
    add_sampling_arguments(p)
    p.add_argument("--seed", type=int, help="sampling seed (default: random each run)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--system", default=os.environ.get("LOCALINFER_SYSTEM") or None,
                   help="system prompt (default: $LOCALINFER_SYSTEM, which a bundle's "
                        "launcher sets)")
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt as is")
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--ctx", type=int, help="context length (default: 4096, at most the model's)")
    p.add_argument("--kv-cache-mb", type=float, help="KV cache budget (default: 2 full contexts)")
    p.add_argument("--stats", action="store_true",
                   help="print the sampling settings, TTFT and tok/s afterwards (and the "
                        "speculative acceptance)")
    add_speculative_arguments(p)
    add_structured_arguments(p)


def main(name: str, args: argparse.Namespace) -> int:
    from localinfer.llm import LLM, GenerationResult
    from localinfer.sampling_defaults import SamplingDefaults

    prompt = args.prompt
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():
            raise InvalidRequestError("no prompt given (pass it as an argument or on stdin)")
        prompt = sys.stdin.read()
    overrides = sampling_overrides(args)
    # flags are checked before the model loads: a typo costs no download or compile
    SamplingDefaults.llama_cpp().params(**overrides, max_tokens=args.max_tokens)
    structured = structured_output(args)
    llm = LLM(args.model, backend=args.backend, threads=args.threads, max_model_len=args.ctx,
              kv_cache_mb=args.kv_cache_mb, progress=True,
              backend_options=backend_options(args), **speculative_options(args))
    try:
        defaults = SamplingDefaults.from_metadata(llm.gguf.metadata)
        params = defaults.params(**overrides, max_tokens=args.max_tokens, seed=args.seed,
                                 stop=args.stop, structured=structured)
        if not args.raw and llm.chat_template.is_fallback:
            print("note: the model has no chat template; using the prompt as plain text",
                  file=sys.stderr)
        request = llm.request(prompt, args.system, raw=args.raw)
        start = time.perf_counter()
        result = GenerationResult()
        for out in llm.stream(request, params):
            result.add(out, start)
            if out.text:
                sys.stdout.write(out.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.stats:
            print(defaults.describe(params, overrides), file=sys.stderr)
            print(result.summary(), file=sys.stderr)
            if llm.engine_config.speculative is not None:
                print(llm.engine.stats().spec_summary(), file=sys.stderr)
    finally:
        llm.close()
    return 0
