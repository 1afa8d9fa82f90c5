"""`localinfer fuzz http|gguf`: the reliability fuzzers, bounded in cases and time.

- `fuzz http`: schemathesis over every operation of the server's own /openapi.json (http_fuzz.py),
  against --url, or a server it starts on loopback for --model (default: the catalog default).
  Against a --url, the operations that delete, pull or unload models are skipped unless --all:
  the fuzzer must not empty someone's model cache; the server it starts has an empty one.
- `fuzz gguf`: the GGUF reader over cut-down real models and hostile files (gguf_fuzz.py).

Both print their figures and exit 1 if anything failed (a 5xx, an answer that breaks the
description, a crash, a hang).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from localinfer.errors import LocalInferError

DESTRUCTIVE = ("DELETE /api/delete", "POST /api/pull", "POST /api/unload")


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="target", metavar="TARGET")
    sub.required = True
    http = sub.add_parser("http", help="fuzz the HTTP API with schemathesis")
    where = http.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server (default: start one for --model)")
    where.add_argument("--model", help="the model the started server serves "
                       "(default: the catalog default)")
    http.add_argument("--api-key", help="the server's API key, if it has one")
    http.add_argument("--max-examples", type=int, default=100,
                      help="cases per operation and mode, valid and invalid (default: 100)")
    http.add_argument("--minutes", type=float, default=10.0, help="time bound (default: 10)")
    http.add_argument("--all", action="store_true",
                      help=f"with --url, fuzz also {', '.join(DESTRUCTIVE)}")
    http.add_argument("--json", action="store_true", help="print the report as JSON")
    gguf = sub.add_parser("gguf", help="fuzz the GGUF reader (atheris, else random mutation)")
    gguf.add_argument("--cases", type=int, default=1_000_000, help="default: 1000000")
    gguf.add_argument("--minutes", type=float, default=30.0, help="time bound (default: 30)")
    gguf.add_argument("--model", action="append", dest="models", metavar="MODEL",
                      help="a real model to cut into seeds (repeatable; default: every "
                      "pulled catalog model)")
    gguf.add_argument("--work", type=Path, help="folder for seeds, corpus and findings "
                      "(default: a new temporary one)")
    gguf.add_argument("--engine", choices=("atheris", "mutation"),
                      help="default: atheris if it is installed")
    gguf.add_argument("--json", action="store_true", help="print the report as JSON")


def main(name: str, args: argparse.Namespace) -> int:
    if args.target == "http":
        return _http(args)
    return _gguf(args)


def _http(args: argparse.Namespace) -> int:
    import dataclasses

    from localinfer.fuzz.http_fuzz import fuzz_http

    skip = DESTRUCTIVE if args.url and not args.all else ()
    with _server(args) as url:
        report = fuzz_http(url, max_examples=args.max_examples, seconds=args.minutes * 60,
                           api_key=args.api_key, skip=skip)
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0 if report.ok else 1
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(report.by_status.items()))
    print(f"operations fuzzed: {report.operations}  cases: {report.cases}  "
          f"in {report.seconds:.0f} s  ({statuses})")
    print(f"server errors (5xx): {report.server_errors}  responses breaking the schema: "
          f"{report.schema_failures}  no answer: {report.transport_errors}")
    fewest = min(report.by_operation.items(), key=lambda kv: kv[1], default=("-", 0))
    print(f"cases per operation: {min(report.by_operation.values(), default=0)} "
          f"({fewest[0]}) to {max(report.by_operation.values(), default=0)}")
    if report.skipped:
        print(f"skipped (--all to include): {', '.join(report.skipped)}")
    for f in report.failures:
        print(f"\n{f.operation} -> {f.status}: {', '.join(f.checks)}\n  {f.message}\n  {f.curl}")
    return 0 if report.ok else 1


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url.rstrip("/")
        return
    from localinfer.catalog import Catalog
    from localinfer.fuzz.own_server import own_server

    with own_server(args.model or Catalog.load().default) as url:
        yield url


def _gguf(args: argparse.Namespace) -> int:
    import dataclasses

    from localinfer.catalog import Catalog
    from localinfer.fuzz.gguf_fuzz import fuzz_gguf

    catalog = Catalog.load()
    if args.models:
        models = [catalog.resolve(m) for m in args.models]
    else:
        models = [p for p in (catalog.path_of(e) for e in catalog.entries.values())
                  if p.is_file()]
    if not models:
        raise LocalInferError("no real model to cut into seeds: pull one, or name a .gguf "
                              "with --model")
    report = fuzz_gguf(args.cases, args.minutes * 60, models, args.work, args.engine)
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0 if report.ok else 1
    print(f"engine: {report.engine}  seeds: {report.seeds} (from {len(models)} real models)")
    print(f"cases: {report.cases} in {report.seconds:.0f} s  "
          f"({report.cases / max(report.seconds, 1e-9):.0f}/s)")
    print(f"loaded: {report.loads}  refused with a clear error: {report.refused}")
    print(f"crashes: {report.crashes}  hangs over 1 s: {report.hangs} (and {report.stalls} "
          "slow once, fast when rerun)")
    print(f"slowest case (the faster of two runs if over 1 s): {report.slowest_s * 1000:.0f} ms"
          f"  peak RSS: {report.peak_rss_mb:.0f} MB")
    for e in report.examples:
        print(f"  {e.get('kind')}: {e.get('detail', '')} {e.get('file', '')}")
    print(f"work folder: {report.work}")
    return 0 if report.ok else 1
