"""`localinfer bench serve`: a load generator for any OpenAI-compatible server.

C concurrent clients send N streamed /v1/completions requests (prompts of about P tokens,
T output tokens each) and it reports output throughput, TTFT p50/p99 and latency p50/p99 and
failures. Prompts differ per request, so a prefix cache cannot skip their prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# short common words: each " word" is one token in the usual BPE vocabularies
_WORD_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one have "
          "this from or had by hot word but what some we can out other were all there when up "
          "use your how said an each she which do their time if will way about many then them "
          "write would like so these her long make thing see him two has look more day could go "
          "come did number sound no most people my over know water than call first who may down "
          "side been now find any new work part take get place made live where after back little "
          "only round man year came show every good me give our under name very through just form "
          "sentence great think say help low line differ turn cause much mean before move right "
          "boy old too same tell does set three want air well also play small end put home read "
          "hand port large spell add even land here must big high such follow act why ask men "
          "change went light kind off need house picture try us again animal point mother world "
          "near build self earth father head stand own page should country found answer school "
          "grow study still learn plant cover food sun four between state keep eye never last let "
          "thought city tree cross farm hard start might story saw far sea draw left late run")
_WORDS = tuple(_WORD_TEXT.split())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="[serve] server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", default="1",
                   help="[serve] concurrent clients; a comma list runs each in turn (1,4,16)")
    p.add_argument("--requests", type=int, help="[serve] requests per run (default 2x clients)")
    p.add_argument("--prompt-len", type=int, default=128, help="[serve] prompt tokens (approx.)")
    p.add_argument("--max-tokens", type=int, default=128, help="[serve] output tokens each")
    p.add_argument("--api-key", help="[serve] bearer token")
    p.add_argument("--timeout", type=float, default=600.0, help="[serve] per-request timeout")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="[serve] do not send ignore_eos (outputs may then be shorter)")
    from localinfer.server import chat_load

    chat_load.add_arguments(p)


@dataclass(slots=True)
class Sample:
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


@dataclass
class RunResult:
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    output_tok_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    latency_p50_s: float
    latency_p99_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def make_prompt(rng: random.Random, n_tokens: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(n_tokens - 1, 1)))


class StreamError(Exception):
    """A server-sent-event stream ended without its `data: [DONE]`, or sent an event that is
    not JSON."""


async def sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style SSE response (an httpx streaming response), until
    `data: [DONE]`; StreamError if the stream ends before it or an event is not JSON. Error
    events are yielded as they come: what one means is the caller's."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise StreamError(f"an event that is not JSON (JSONDecodeError: {exc})") from exc
        yield event
    raise StreamError("the stream ended without [DONE]")


async def _one(client: Any, body: dict[str, Any]) -> Sample:
    import httpx

    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                return Sample(False, error=f"HTTP {r.status_code}: {text[:200]}")
            async for event in sse_events(r):
                if "error" in event:
                    return Sample(False, error=str(event["error"])[:200])
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    if choice.get("text"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter()
    except (httpx.HTTPError, StreamError) as exc:
        return Sample(False, error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    out = int(usage["completion_tokens"]) if usage else chunks
    prompt = int(usage["prompt_tokens"]) if usage else 0
    if first is None:
        return Sample(False, error="no output")
    return Sample(True, first - start, end - start, out, prompt)


async def run_once(args: argparse.Namespace, concurrency: int, model: str | None) -> RunResult:
    import httpx

    n = args.requests or 2 * concurrency
    rng = random.Random(1234 + concurrency)
    bodies = []
    for _ in range(n):
        body: dict[str, Any] = {"prompt": make_prompt(rng, args.prompt_len),
                                "max_tokens": args.max_tokens, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        if not args.no_ignore_eos:
            body["ignore_eos"] = True
        # fields a particular server needs (serve_peers: llama-cpp-python's logit_bias)
        body.update(getattr(args, "extra_body", None) or {})
        bodies.append(body)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    samples: list[Sample] = []
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=args.timeout) as client:

        async def worker() -> None:
            while not queue.empty():
                samples.append(await _one(client, queue.get_nowait()))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ok = [s for s in samples if s.ok]
    return RunResult(
        concurrency=concurrency, requests=n, failed=n - len(ok), wall_s=wall,
        output_tok_s=sum(s.output_tokens for s in ok) / wall,
        ttft_p50_s=percentile([s.ttft_s for s in ok], 0.5),
        ttft_p99_s=percentile([s.ttft_s for s in ok], 0.99),
        latency_p50_s=percentile([s.latency_s for s in ok], 0.5),
        latency_p99_s=percentile([s.latency_s for s in ok], 0.99),
        mean_prompt_tokens=sum(s.prompt_tokens for s in ok) / max(len(ok), 1),
        mean_output_tokens=sum(s.output_tokens for s in ok) / max(len(ok), 1),
        errors=sorted({s.error for s in samples if not s.ok})[:5],
    )


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def format_table(results: list[RunResult]) -> str:
    head = ["concurrency", "requests", "failed", "output tok/s", "TTFT p50", "TTFT p99",
            "latency p50", "latency p99", "prompt tok", "output tok"]
    return markdown_table(head, [
        [str(r.concurrency), str(r.requests), str(r.failed), f"{r.output_tok_s:.1f}",
         f"{r.ttft_p50_s:.2f} s", f"{r.ttft_p99_s:.2f} s", f"{r.latency_p50_s:.2f} s",
         f"{r.latency_p99_s:.2f} s", f"{r.mean_prompt_tokens:.0f}",
         f"{r.mean_output_tokens:.0f}"] for r in results])


def main(args: argparse.Namespace) -> int:
    from localinfer.errors import InvalidRequestError

    if not args.url:
        raise InvalidRequestError("bench serve needs --url (an OpenAI-compatible server)")
    try:
        levels = [int(c) for c in str(args.concurrency).split(",")]
    except ValueError as exc:
        raise InvalidRequestError(f"invalid --concurrency: {args.concurrency!r}") from exc
    if any(c < 1 for c in levels) or args.prompt_len < 1 or args.max_tokens < 1:
        raise InvalidRequestError("--concurrency, --prompt-len and --max-tokens must be >= 1")
    model = getattr(args, "model", None)
    if getattr(args, "chats", None) is not None:
        return _chats(args, levels, model)
    results = []
    for c in levels:
        result = asyncio.run(run_once(args, c, model))
        results.append(result)
        for e in result.errors:
            print(f"  error: {e}")
    print(f"bench serve: {args.url}, prompts ~{args.prompt_len} tokens, "
          f"{args.max_tokens} output tokens")
    print(format_table(results))
    out = getattr(args, "json", None)
    if out is not None:
        Path(out).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


def _chats(args: argparse.Namespace, levels: list[int], model: str | None) -> int:
    from localinfer.errors import InvalidRequestError
    from localinfer.server import chat_load

    if min(args.chats, args.turns, args.system_prompts, args.system_len, args.user_len) < 1:
        raise InvalidRequestError("--chats, --turns, --system-prompts, --system-len and "
                                  "--user-len must be >= 1")
    results = []
    for c in levels:
        result = asyncio.run(chat_load.run_chats(args, c, model))
        results.append(result)
        for e in result.errors:
            print(f"  error: {e}")
    print(f"bench serve --chats: {args.url}, {args.chats} chats x {args.turns} turns, "
          f"{args.system_prompts} system prompts of ~{args.system_len} tokens, user turns "
          f"~{args.user_len} tokens, {args.max_tokens} output tokens")
    print(chat_load.format_chat_table(results))
    out = getattr(args, "json", None)
    if out is not None:
        Path(out).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0
