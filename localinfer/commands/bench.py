"""`localinfer bench`: localinfer vs llama.cpp on the same GGUF and thread count, as ratios."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from localinfer.commands.backend_flags import add_backend_arguments, backend_options
from localinfer.commands.speculative_flags import add_speculative_arguments, speculative_options
from localinfer.errors import BackendUnavailableError, InvalidRequestError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    from localinfer.bench.soak import main as soak  # light: no HTTP client imported until it runs
    from localinfer.server import loadgen

    p.add_argument("mode", nargs="?", choices=("serve", "soak", "chat"),
                   help="'serve': load-test an OpenAI-compatible server (--url; see [serve]); "
                        "'soak': minutes of mixed, abusive load on a server (--url, or one it "
                        "starts with --model; see [soak]); "
                        "'chat': the chat app's visible decode rate vs the engine's")
    loadgen.add_arguments(p)
    soak.add_arguments(p)
    p.add_argument("--model", "-m", help="catalog name or path to a .gguf file")
    add_backend_arguments(p)
    p.add_argument("--threads", type=int, help="CPU threads, both sides (default: physical cores)")
    p.add_argument("--peer", choices=("llamacpp", "none"), default="llamacpp",
                   help="compare against llama-cpp-python in-process (default) or nothing")
    p.add_argument("--peer-bench", metavar="PATH",
                   help="also run this native llama-bench binary (-p 512 -n 128 -t N)")
    p.add_argument("--json", metavar="FILE", type=Path, help="write every number to FILE")
    p.add_argument("--quick", action="store_true", help="fewer and shorter repetitions")
    p.add_argument("--aggregate", metavar="COUNTS", default="1,4,16,64",
                   help="concurrent sequences of the aggregate-decode rows, a comma list "
                        "(default 1,4,16,64; fewer makes a bigger model's run shorter)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="run N CPU-bound busy processes beside every measurement, both sides "
                        "alike: how each engine copes on a busy machine (default 0)")
    p.add_argument("--structured-schema", metavar="FILE",
                   help="the JSON Schema of the structured decode rows (implies --structured)")
    p.add_argument("--tokens", type=int, default=256,
                   help="chat: tokens per reply; --speculative: most tokens per request "
                        "(default 256)")
    p.add_argument("--reps", type=int, default=3, help="chat: repetitions (default 3)")
    add_speculative_arguments(p)
    p.add_argument("--structured", action="store_true",
                   help="also measure structured output (localinfer only): mask time per "
                        "step, first mask of a new schema, constrained vs unconstrained decode")


def main(name: str, args: argparse.Namespace) -> int:
    mode = getattr(args, "mode", None)
    if mode is not None and (args.speculative or args.num_speculative_tokens):
        where = "start the server with it" if mode == "serve" else "not measured there yet"
        raise InvalidRequestError(f"--speculative is not an option of `bench {mode}` ({where})")
    if getattr(args, "mode", None) == "serve":
        from localinfer.server import loadgen

        return loadgen.main(args)
    if mode == "soak":
        from localinfer.bench.soak import main as soak

        return soak.main(args)
    if getattr(args, "mode", None) == "chat":
        return _chat(args)
    if args.speculative is not None:
        return _speculative(args)
    from localinfer.bench import orchestrate, report
    from localinfer.bench.plan import BenchPlan
    from localinfer.catalog import Catalog
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    peer = args.peer == "llamacpp"
    options = backend_options(args) or {}
    if (peer or args.backend == "llamacpp") and importlib.util.find_spec("llama_cpp") is None:
        raise BackendUnavailableError(
            "the llama.cpp peer needs llama-cpp-python (pip install 'localinfer[llamacpp]'); "
            "or pass --peer none")
    if args.load < 0:
        raise InvalidRequestError(f"invalid --load: must be >= 0, got {args.load}")
    if args.threads is not None and args.threads < 1:
        raise InvalidRequestError(f"invalid --threads: must be >= 1, got {args.threads}")
    path = Catalog.load().resolve(args.model, progress=True)
    with open_gguf(path) as g:
        # llama.cpp runs architectures the Numba backend does not know
        config = ModelConfig.from_gguf(g, strict_arch=args.backend != "llamacpp")
    threads = args.threads or _physical_cores()
    try:
        plan = BenchPlan.make(str(Path(path).resolve()), threads, config.n_ctx_train, args.quick)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc
    plan.agg_counts = _aggregate_counts(args.aggregate)
    plan.load = args.load
    plan.backend, plan.n_gpu_layers = args.backend, options.get("n_gpu_layers", 0)
    plan.flash_attn = options.get("flash_attn")
    plan.structured = args.structured or args.structured_schema is not None
    if args.structured_schema is not None:
        plan.structured_schema = _read_schema(args.structured_schema)
    raw = orchestrate.run_all(plan, peer, args.peer_bench)
    doc = report.build(plan, raw)
    if args.json is not None:
        report.write_json(args.json, doc)
    lcp = doc["host"].get("llama_cpp_python")
    print(f"localinfer bench: {Path(path).name}, {args.backend} backend, {threads} threads"
          + (f", llama-cpp-python {lcp}" if peer else "") + (", quick" if args.quick else "")
          + (f", {plan.load} competing busy processes" if plan.load else ""))
    print(report.table(doc, plan))
    return 0


def _chat(args: argparse.Namespace) -> int:
    from localinfer.bench import chat, report

    for flag, value in (("--tokens", args.tokens), ("--reps", args.reps)):
        if value < 1:
            raise InvalidRequestError(f"invalid {flag}: must be >= 1, got {value}")
    if args.threads is not None and args.threads < 1:
        raise InvalidRequestError(f"invalid --threads: must be >= 1, got {args.threads}")
    reps, tokens = (1, min(args.tokens, 64)) if args.quick else (args.reps, args.tokens)
    result = chat.run(args.model, tokens, reps, args.threads, args.backend,
                      backend_options(args))
    if args.json is not None:
        report.write_json(args.json, result.to_dict())
    print(result.table())
    return 0


def _speculative(args: argparse.Namespace) -> int:
    """Plain vs speculative decoding on three workloads and 16 mixed streams (with --quick:
    64 tokens, 4 streams)."""
    from localinfer.bench import report, speculative

    options = speculative_options(args)
    if args.tokens < 1:
        raise InvalidRequestError(f"invalid --tokens: must be >= 1, got {args.tokens}")
    tokens, streams = (min(args.tokens, 64), 4) if args.quick else (args.tokens, 16)
    result = speculative.run(args.model, options["speculative"],
                             options["num_speculative_tokens"], args.threads, args.backend,
                             backend_options(args), tokens, streams)
    if args.json is not None:
        report.write_json(args.json, result.to_dict())
    print(result.table())
    return 0


def _aggregate_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise InvalidRequestError(
            f"invalid --aggregate {text!r}: a comma list of sequence counts >= 1, e.g. 1,4,16")
    return counts


def _physical_cores() -> int:
    from localinfer.backends.numba_cpu.runner import physical_cores

    return physical_cores()


def _read_schema(path: str) -> str:
    import json

    from localinfer.commands.structured_flags import read_text

    text = read_text(path, "--structured-schema")
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(f"--structured-schema: {path} is not JSON: {exc}") from exc
    return text
