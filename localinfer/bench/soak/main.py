"""`localinfer bench soak`: its options, and the run against --url or a server it starts."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.errors import InvalidRequestError

if TYPE_CHECKING:
    from localinfer.bench.soak.server_proc import ServerOptions

DEFAULT_MODEL = "smollm2-135m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("soak (bench soak; --url, --model, --threads, --api-key, "
                             "--timeout and --json apply too)")
    g.add_argument("--clients", type=int, default=16, help="[soak] concurrent clients")
    g.add_argument("--duration", default="10m",
                   help="[soak] how long: seconds, or 30s, 10m, 1h (default 10m)")
    g.add_argument("--overload", action="store_true",
                   help="[soak] the overload run instead: an unloaded baseline, then "
                        "--burst-factor x capacity clients retrying at once when refused")
    g.add_argument("--disconnect-rate", type=float, default=0.2,
                   help="[soak] share of requests hung up on (default 0.2)")
    g.add_argument("--hostile-rate", type=float, default=0.05,
                   help="[soak] share of malformed or hostile requests (default 0.05)")
    g.add_argument("--burst-every", type=float, default=60.0,
                   help="[soak] seconds between bursts (0: none; default 60)")
    g.add_argument("--burst-factor", type=float, default=3.0,
                   help="[soak] burst size as a multiple of capacity (default 3)")
    g.add_argument("--capacity", type=int,
                   help="[soak] sequences the server runs at once (default: its "
                        "--max-num-seqs when the soak starts it, else 16)")
    g.add_argument("--max-num-seqs", type=int, default=16, help="[soak] own server's")
    g.add_argument("--max-queue", type=int,
                   help="[soak] own server's --max-queue (default: --max-num-seqs; with "
                        "--overload 0: only what can run at once is admitted)")
    g.add_argument("--max-prefill-backlog", type=int, metavar="TOKENS",
                   help="[soak] own server's --max-prefill-backlog (default: none; with "
                        "--overload 0: a new request only while no prompt waits for its "
                        "prefill; -1: none)")
    g.add_argument("--ctx", type=int, default=2048, help="[soak] own server's context")
    g.add_argument("--warmup", type=float,
                   help="[soak] seconds before RSS growth is measured (default: a fifth of "
                        "the run, at most 60)")
    g.add_argument("--baseline-clients", type=int, default=1,
                   help="[soak] clients of the overload run's unloaded baseline (default 1)")
    g.add_argument("--baseline-requests", type=int, default=120,
                   help="[soak] requests of the overload run's unloaded baseline (default 120)")
    g.add_argument("--ignore-retry-after", action="store_true",
                   help="[soak] overload clients come back 50-250 ms after a rejection "
                        "instead of after its Retry-After (+-25%%)")
    g.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="[soak] one more argument for the server it starts (repeatable), "
                        "e.g. --serve-arg=--max-num-batched-tokens=256")
    g.add_argument("--server-pid", type=int, help="[soak] with --url: the server's pid, "
                                                  "for its RSS")
    g.add_argument("--seed", type=int, default=0, help="[soak] workload seed")


def parse_duration(text: str) -> float:
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = str(text).strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise InvalidRequestError(f"invalid --duration {text!r}: seconds, or 30s, 10m, 1h")
    return value


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server the soak starts. --overload admits only what can run at once (--max-queue 0)
    and a new request only while no prompt waits for its prefill (--max-prefill-backlog 0):
    an admitted request's prefill then runs beside decodes only, not behind other prompts, so
    its TTFT stays near an unloaded one's (3-minute overload: p99 887 ms without the rule,
    522 ms with it, 326-445 ms unloaded)."""
    from localinfer.bench.soak.server_proc import ServerOptions

    max_queue = args.max_queue if args.max_queue is not None else (
        0 if args.overload else args.max_num_seqs)
    backlog = args.max_prefill_backlog if args.max_prefill_backlog is not None else (
        0 if args.overload else -1)
    return ServerOptions(args.model or DEFAULT_MODEL, args.max_num_seqs, max_queue,
                         backlog if backlog >= 0 else None, args.ctx, args.threads,
                         tuple(args.serve_arg))


def main(args: argparse.Namespace) -> int:
    from localinfer.bench.soak import report
    from localinfer.bench.soak.run import SoakPlan, run
    from localinfer.bench.soak.server_proc import ServerProcess

    duration = parse_duration(args.duration)
    for flag, value in (("--clients", args.clients), ("--max-num-seqs", args.max_num_seqs),
                        ("--ctx", args.ctx), ("--baseline-clients", args.baseline_clients),
                        ("--baseline-requests", args.baseline_requests)):
        if value < 1:
            raise InvalidRequestError(f"invalid {flag}: must be >= 1, got {value}")
    for flag, rate in (("--disconnect-rate", args.disconnect_rate),
                       ("--hostile-rate", args.hostile_rate)):
        if not 0 <= rate <= 1:
            raise InvalidRequestError(f"invalid {flag}: a share in 0..1, got {rate}")
    if args.disconnect_rate + args.hostile_rate > 1:
        raise InvalidRequestError("--disconnect-rate + --hostile-rate must be <= 1")
    server = None
    if not args.url:
        options = server_options(args)
        log = Path(args.json).with_suffix(".serve.log") if args.json else None
        server = ServerProcess(options, log)
        print(f"starting: localinfer {' '.join(options.argv(server.port)[3:])}", flush=True)
        server.start()
    url = args.url or server.url  # type: ignore[union-attr]
    plan = SoakPlan(
        url=url, pid=server.pid if server else args.server_pid, clients=args.clients,
        duration_s=duration,
        capacity=args.capacity or (args.max_num_seqs if server else 16),
        burst_every_s=args.burst_every, burst_factor=args.burst_factor,
        warmup_s=args.warmup if args.warmup is not None else min(60.0, duration / 5),
        disconnect_rate=args.disconnect_rate, hostile_rate=args.hostile_rate,
        seed=args.seed, timeout_s=args.timeout, baseline_clients=args.baseline_clients,
        baseline_requests=args.baseline_requests, ignore_retry_after=args.ignore_retry_after,
        api_key=args.api_key)
    try:
        result = run(plan, overload=args.overload)
    finally:
        exit_code = server.stop() if server else None
    if server is not None and exit_code not in (0, None):
        print(f"the server exited with {exit_code}: {server.log_tail()}")
    print(report.table(result))
    if args.json is not None:
        report.write_json(Path(args.json), result)
    return 0 if result.analysis.passed else 1
