"""`localinfer serve`: the OpenAI-compatible HTTP server (needs the [server] extra)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from localinfer.commands.backend_flags import add_backend_arguments, backend_options
from localinfer.commands.speculative_flags import add_speculative_arguments, speculative_options
from localinfer.errors import BackendUnavailableError, InvalidRequestError, LocalInferError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", action="append", default=[], metavar="MODEL",
                   help="catalog name or path to a .gguf file (repeatable: requests choose by "
                   "their `model`; the first is the default and loads at start). Without it: "
                   "every pulled catalog model, loaded on first use")
    p.add_argument("--served-model-name",
                   help="the id clients use for the first model (default: its name)")
    p.add_argument("--allow-pull", action="store_true",
                   help="pull a catalog model a request names if it is not pulled yet")
    p.add_argument("--max-memory", metavar="SIZE",
                   help="memory the loaded models may hold, weights + KV cache: MB, or with a "
                   "unit (8G); the least recently used idle model is unloaded to make room "
                   "(default: 75%% of RAM)")
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="unload a model idle this long: seconds or 5m, 1h; 0 right after each "
                   "request; -1 never (default: 5m; with a single --model, never)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (not for /health)")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback bind without an API key")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also accept this Host header (repeatable; '*' for any)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow this browser origin (repeatable; CORS is off by default)")
    add_backend_arguments(p)
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--ctx", type=int, help="context length (default: 4096, at most the model's)")
    p.add_argument("--kv-cache-mb", type=float, help="KV cache budget in MB")
    p.add_argument("--max-num-seqs", type=int, default=16, help="sequences batched per step")
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--no-prefix-caching", action="store_true")
    add_speculative_arguments(p)
    p.add_argument("--max-queue", type=int,
                   help="requests that may wait for a running slot before new ones get "
                        "429 (0: only what can run at once; default: unbounded)")
    p.add_argument("--max-prefill-backlog", type=int, metavar="TOKENS",
                   help="while more prompt tokens than this wait for their prefill, new "
                        "requests get 429: bounds an admitted request's time to first token "
                        "under overload (0: one prompt at a time; default: unbounded)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="request body limit")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds in-flight requests may take to finish")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    add_cluster_arguments(p)


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (--ray; needs the [cluster] extra)")
    g.add_argument("--ray", action="store_true",
                   help="run engine replicas on Ray Serve behind one HTTP endpoint")
    g.add_argument("--replicas", type=int, help="engine replicas (default: 1)")
    g.add_argument("--min-replicas", type=int,
                   help="autoscale on queue length from this many replicas")
    g.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    g.add_argument("--threads-per-replica", type=int, default=1, metavar="T",
                   help="CPU threads (and Ray CPUs) per engine replica (default: 1)")
    g.add_argument("--ray-address", metavar="ADDR",
                   help="join a running Ray cluster ('auto': the one on this node); "
                   "default: start Ray on this machine only")
    g.add_argument("--router", choices=("prefix", "round-robin"), default="prefix",
                   help="replica choice: by prompt prefix (default) or round-robin")
    g.add_argument("--router-threshold", type=int, metavar="N",
                   help="prefix router: go to a less loaded replica when the prefix's one "
                   "has more than N requests more (default: 4)")


def main(name: str, args: argparse.Namespace) -> int:
    for module in ("starlette", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(module) is None:
            raise BackendUnavailableError(
                f"`localinfer serve` needs {module}: pip install 'localinfer[server]'")
    from localinfer.catalog import Catalog
    from localinfer.server.config import ServerConfig, is_loopback
    from localinfer.server.models.keep_alive import parse_keep_alive
    from localinfer.server.models.memory_plan import parse_memory
    from localinfer.server.runner import build_server

    if not is_loopback(args.host) and not args.api_key and not args.insecure:
        raise InvalidRequestError(
            f"binding to {args.host} exposes the server beyond this machine; set --api-key "
            "(or pass --insecure to serve without one)")
    for flag, value in (("--port", args.port), ("--max-queue", args.max_queue),
                        ("--max-prefill-backlog", args.max_prefill_backlog)):
        if value is not None and value < 0:
            raise InvalidRequestError(f"invalid {flag}: must be >= 0, got {value}")
    max_memory = parse_memory(args.max_memory) if args.max_memory else None
    if args.keep_alive is not None:
        parse_keep_alive(args.keep_alive)  # a typo fails here, not at the first request
    config = ServerConfig(
        model=args.model[0] if args.model else None, models=list(args.model),
        allow_pull=args.allow_pull, max_memory=max_memory, keep_alive=args.keep_alive,
        served_model_name=args.served_model_name, host=args.host,
        port=args.port, api_key=args.api_key, allowed_hosts=args.allowed_host,
        cors_origins=args.cors_origin, max_body_bytes=int(args.max_body_mb * (1 << 20)),
        max_queue=args.max_queue, max_prefill_backlog=args.max_prefill_backlog,
        drain_timeout=args.drain_timeout, backend=args.backend,
        backend_options=backend_options(args),
        threads=args.threads, max_model_len=args.ctx, kv_cache_mb=args.kv_cache_mb,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, warmup=not args.no_warmup,
        log_level=args.log_level, speculative=speculative_options(args))
    if args.ray:
        return _serve_ray(config, args)
    _reject_cluster_flags(args)
    catalog = Catalog.load()
    # fail fast on a missing file; a named catalog model is pulled now, with a bar
    paths = [catalog.resolve(m, progress=True) for m in args.model]
    _setup_logging(args.log_level)
    # the model loads beside uvicorn's log: a first compile shows as log lines, not a bar
    import logging

    from localinfer import compile_progress

    compile_progress.report_to(compile_progress.LogReporter(logging.getLogger("localinfer.server")))
    server = build_server(config, model_path=paths[0] if paths else None, catalog=catalog)
    server.run()
    if server.failed:
        raise LocalInferError(f"the model failed to load: {server.state.load_error}")
    return 0


def _reject_cluster_flags(args: argparse.Namespace) -> None:
    for flag in ("replicas", "min_replicas", "max_replicas", "ray_address",
                 "router_threshold"):
        if getattr(args, flag) is not None:
            raise InvalidRequestError(f"--{flag.replace('_', '-')} needs --ray")


def _serve_ray(config: Any, args: argparse.Namespace) -> int:
    """Check the cluster flags, then run the Serve application until stopped."""
    if importlib.util.find_spec("ray") is None:
        raise BackendUnavailableError(
            "`localinfer serve --ray` needs Ray Serve: pip install 'localinfer[cluster]'")
    if len(args.model) > 1:
        raise InvalidRequestError("--ray serves one model: give a single --model")
    fixed = args.replicas is not None
    scaled = args.min_replicas is not None or args.max_replicas is not None
    if fixed and scaled:
        raise InvalidRequestError("give --replicas or --min-replicas/--max-replicas, not both")
    for flag in ("replicas", "max_replicas", "threads_per_replica"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InvalidRequestError(f"invalid --{flag.replace('_', '-')}: must be >= 1, "
                                      f"got {value}")
    if args.min_replicas is not None and args.min_replicas < 0:
        raise InvalidRequestError(f"invalid --min-replicas: must be >= 0, got "
                                  f"{args.min_replicas}")
    if args.router_threshold is not None and (args.router_threshold < 0
                                              or args.router != "prefix"):
        raise InvalidRequestError("--router-threshold is a number >= 0 for --router prefix")
    if (args.min_replicas is not None and args.max_replicas is not None
            and args.min_replicas > args.max_replicas):
        raise InvalidRequestError("--min-replicas is larger than --max-replicas")
    from localinfer.catalog import Catalog
    from localinfer.cluster.launch import ClusterOptions, run

    catalog = Catalog.load()
    model = args.model[0] if args.model else catalog.default
    catalog.resolve(model, progress=True)  # pulled on this node; the others need it too
    config.model, config.models = model, [model]
    _setup_logging(args.log_level)
    run(config, model, ClusterOptions(
        replicas=args.replicas, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        threads_per_replica=args.threads_per_replica, address=args.ray_address,
        router=args.router, imbalance_threshold=args.router_threshold))
    return 0


def _setup_logging(level: str) -> None:
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger = logging.getLogger("localinfer")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
