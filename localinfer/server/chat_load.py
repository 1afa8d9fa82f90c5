"""`localinfer bench serve --chats N`: multi-turn chats sharing a few system prompts.

N chats of T turns each; chat i uses system prompt i mod S (S prompts of about --system-len
tokens) and sends T user messages of about --user-len tokens, each with the whole conversation
so far (its earlier replies included), streamed. --concurrency chats run at once; a chat's
turns run one after another, as a person's would. This is the load a prefix cache (and a
prefix-aware router in front of several engines) is for: every turn after the first repeats
a system prompt and the chat's history.

Reported: TTFT p50/p99 of first turns and of later turns, the prefix-cache hit rate over the
run (from the server's /metrics counters, summed over models and replicas: cached prompt
tokens / prompt tokens looked up), and how many distinct replicas answered (from the
x-localinfer-replica header of `serve --ray`; 0 from a single server).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from localinfer.server.loadgen import (
    StreamError,
    make_prompt,
    markdown_table,
    percentile,
    sse_events,
)

REPLICA_HEADER = "x-localinfer-replica"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chats", type=int, help="[serve] multi-turn mode: this many chats")
    p.add_argument("--turns", type=int, default=4, help="[serve --chats] turns per chat")
    p.add_argument("--system-prompts", type=int, default=4,
                   help="[serve --chats] distinct system prompts the chats share")
    p.add_argument("--system-len", type=int, default=256,
                   help="[serve --chats] system prompt tokens (approx.)")
    p.add_argument("--user-len", type=int, default=32,
                   help="[serve --chats] tokens per user message (approx.)")


@dataclass(slots=True)
class Turn:
    index: int
    ok: bool
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    replica: str = ""
    error: str = ""


@dataclass
class ChatResult:
    chats: int
    turns: int
    system_prompts: int
    concurrency: int
    failed: int
    wall_s: float
    first_ttft_p50_s: float
    first_ttft_p99_s: float
    later_ttft_p50_s: float
    later_ttft_p99_s: float
    hit_rate: float  # from /metrics
    client_cached_share: float  # usage.cached_tokens / prompt_tokens of later turns
    replicas: int
    errors: list[str] = field(default_factory=list)


async def _turn(client: Any, index: int, body: dict[str, Any]) -> tuple[Turn, str]:
    start = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            err = (await r.aread()).decode("utf-8", "replace")[:200]
            return Turn(index, False, error=f"HTTP {r.status_code}: {err}"), ""
        replica = r.headers.get(REPLICA_HEADER, "")
        try:
            async for event in sse_events(r):
                if "error" in event:
                    return Turn(index, False, error=str(event["error"])[:200]), ""
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        text.append(piece)
                        if first is None:
                            first = time.perf_counter()
        except StreamError as exc:
            return Turn(index, False, error=str(exc)), ""
    if first is None:
        return Turn(index, False, error="no output"), ""
    details = usage.get("prompt_tokens_details") or {}
    return Turn(index, True, first - start, int(usage.get("prompt_tokens", 0)),
                int(details.get("cached_tokens") or 0), replica), "".join(text)


async def _chat(client: Any, args: argparse.Namespace, system: str, rng: random.Random,
                model: str | None) -> list[Turn]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    turns: list[Turn] = []
    for t in range(args.turns):
        messages.append({"role": "user", "content": make_prompt(rng, args.user_len)})
        body: dict[str, Any] = {"messages": messages, "max_tokens": args.max_tokens,
                                "temperature": 0.0, "stream": True,
                                "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        if not args.no_ignore_eos:
            body["ignore_eos"] = True
        turn, reply = await _turn(client, t, body)
        turns.append(turn)
        if not turn.ok:
            break
        messages.append({"role": "assistant", "content": reply})
    return turns


async def _cache_counters(client: Any) -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over the /metrics label sets."""
    text = (await client.get("/metrics")).text
    hit = queried = 0.0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("localinfer_prefix_cache_hit_tokens_total"):
            hit += float(value)
        elif name.startswith("localinfer_prefix_cache_queried_tokens_total"):
            queried += float(value)
    return hit, queried


async def run_chats(args: argparse.Namespace, concurrency: int, model: str | None
                    ) -> ChatResult:
    import httpx

    rng = random.Random(4321)
    systems = [make_prompt(rng, args.system_len) for _ in range(args.system_prompts)]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    pending = list(range(args.chats))
    all_turns: list[Turn] = []
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=args.timeout) as client:
        hit0, queried0 = await _cache_counters(client)

        async def worker() -> None:
            while pending:
                i = pending.pop(0)
                chat_rng = random.Random(i)
                all_turns.extend(await _chat(client, args, systems[i % len(systems)],
                                             chat_rng, model))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        await asyncio.sleep(0.5)  # a cluster's replicas report their counters as requests end
        hit1, queried1 = await _cache_counters(client)
    ok = [t for t in all_turns if t.ok]
    first = [t.ttft_s for t in ok if t.index == 0]
    later = [t for t in ok if t.index > 0]
    queried = queried1 - queried0
    return ChatResult(
        chats=args.chats, turns=args.turns, system_prompts=args.system_prompts,
        concurrency=concurrency, failed=args.chats * args.turns - len(ok), wall_s=wall,
        first_ttft_p50_s=percentile(first, 0.5), first_ttft_p99_s=percentile(first, 0.99),
        later_ttft_p50_s=percentile([t.ttft_s for t in later], 0.5),
        later_ttft_p99_s=percentile([t.ttft_s for t in later], 0.99),
        hit_rate=(hit1 - hit0) / queried if queried else float("nan"),
        client_cached_share=(sum(t.cached_tokens for t in later)
                             / max(sum(t.prompt_tokens for t in later), 1)),
        replicas=len({t.replica for t in ok if t.replica}),
        errors=sorted({t.error for t in all_turns if not t.ok})[:5])


def format_chat_table(results: list[ChatResult]) -> str:
    head = ["concurrency", "chats x turns", "failed", "wall", "TTFT p50 turn 1",
            "TTFT p99 turn 1", "TTFT p50 later", "TTFT p99 later", "prefix-cache hit rate",
            "cached share later", "replicas"]
    return markdown_table(head, [
        [str(r.concurrency), f"{r.chats} x {r.turns}", str(r.failed), f"{r.wall_s:.1f} s",
         _ms(r.first_ttft_p50_s), _ms(r.first_ttft_p99_s), _ms(r.later_ttft_p50_s),
         _ms(r.later_ttft_p99_s), f"{r.hit_rate:.1%}", f"{r.client_cached_share:.1%}",
         str(r.replicas)] for r in results])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"
