"""The soak's phases against a server at `url` (started by main.py or given).

Soak: `clients` closed-loop clients for `duration_s`, each drawing its next request from the
Workload (normal, disconnecting, hostile); a rejected client waits the Retry-After it got (at
most 5 s), as a polite client would; every `burst_every_s` a burst of `burst_factor` x
`capacity` one-shot requests lands at once. Then the server is left idle and its KV blocks
compared with the baseline taken before the load.

Overload: an unloaded baseline (`baseline_clients` clients, streamed requests of one shape),
then `burst_factor` x `capacity` closed-loop clients sending requests of that shape for
`duration_s`: that many users for the server's slots. A rejected client comes back after the
Retry-After it got, +-25% so the refused do not return as one herd, as the openai client
does; with `ignore_retry_after` after 50-250 ms, a client hammering the server (each refusal
costs the server a parse and the load generator a request, on the same machine here: ~200 a
second took ~0.5 of the 2 cores from the kernels and doubled a prefill's time).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from localinfer.bench.soak.analysis import Analysis, analyse
from localinfer.bench.soak.client import Outcome, send
from localinfer.bench.soak.sampler import Sample, Sampler, scrape
from localinfer.bench.soak.workload import RequestSpec, Workload
from localinfer.errors import LocalInferError
from localinfer.server.loadgen import percentile

BURST_TOKENS = (16, 48)  # burst and overload requests: short, so waves turn over quickly
HAMMER_RETRY_S = (0.05, 0.25)  # an overload client's pause after a rejection, ignoring
RETRY_JITTER = (0.75, 1.25)  # ... or the factor on the Retry-After it honours


@dataclass
class SoakPlan:
    url: str
    pid: int | None = None  # the server's, for its RSS
    clients: int = 16
    duration_s: float = 600.0
    capacity: int = 16  # sequences the server runs at once (its --max-num-seqs)
    burst_every_s: float = 60.0  # 0: no bursts
    burst_factor: float = 3.0
    warmup_s: float = 60.0
    disconnect_rate: float = 0.2
    hostile_rate: float = 0.05
    oversized_mb: float = 16.0
    seed: int = 0
    timeout_s: float = 300.0
    idle_timeout_s: float = 60.0
    baseline_clients: int = 1
    # the p99 of 40 is their maximum, of 120 the second largest: the ratio's denominator
    # moved 223-453 ms between runs with 40
    baseline_requests: int = 120
    ignore_retry_after: bool = False  # overload clients hammer (HAMMER_RETRY_S)
    api_key: str | None = None

    @property
    def burst_size(self) -> int:
        return max(int(round(self.capacity * self.burst_factor)), 1)


@dataclass
class RunResult:
    mode: str
    plan: SoakPlan
    outcomes: list[Outcome]
    samples: list[Sample]
    analysis: Analysis
    wall_s: float
    model: str

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"mode": self.mode, "model": self.model, "wall_s": self.wall_s,
                "plan": asdict(self.plan), **self.analysis.to_dict(),
                "samples": [s.to_dict() for s in self.samples],
                "outcomes": [o.to_dict() for o in self.outcomes]}


def run(plan: SoakPlan, overload: bool = False) -> RunResult:
    return asyncio.run(_run(plan, overload))


async def _run(plan: SoakPlan, overload: bool) -> RunResult:
    headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else {}
    limits = httpx.Limits(max_connections=plan.clients + 2 * plan.burst_size + 8,
                          max_keepalive_connections=plan.clients + 8)
    async with httpx.AsyncClient(base_url=plan.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=plan.timeout_s) as client:
        model, max_len = await _model(client)
        workload = Workload(model, max_len, plan.disconnect_rate, plan.hostile_rate,
                            oversized_mb=plan.oversized_mb)
        t0 = time.perf_counter()
        kv_baseline, _ = await _wait_idle(client, None, plan.idle_timeout_s, t0)
        sampler = Sampler(client, plan.pid, t0).start()
        baseline_p99 = None
        if overload:
            baseline = await _baseline(client, plan, workload, t0)
            baseline_p99 = percentile([o.ttft_s for o in baseline if o.ttft_s is not None], 0.99)
            outcomes = baseline + await _overload(client, plan, workload, t0)
        else:
            outcomes = await _soak(client, plan, workload, t0)
        kv_idle, last = await _wait_idle(client, kv_baseline, plan.idle_timeout_s, t0)
        await sampler.stop()
        samples = sampler.samples + ([last] if last is not None else [])
        wall = time.perf_counter() - t0
    measured = [o for o in outcomes if o.phase != "baseline"]
    analysis = analyse(measured, samples, kv_baseline, kv_idle, plan.warmup_s, baseline_p99)
    return RunResult("overload" if overload else "soak", plan, outcomes, samples, analysis,
                     wall, model)


async def _model(client: httpx.AsyncClient) -> tuple[str, int]:
    """The default (first loaded) model's id and context length, from /v1/models."""
    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise LocalInferError(f"cannot reach the server at {client.base_url}: {exc}") from exc
    if r.status_code != 200:
        raise LocalInferError(f"GET /v1/models answered {r.status_code}: {r.text[:200]}")
    cards = r.json().get("data") or []
    loaded = [c for c in cards if c.get("loaded", True)]
    if not loaded:
        raise LocalInferError("the server has no model loaded (send it one request first)")
    return str(loaded[0]["id"]), int(loaded[0].get("max_model_len") or 2048)


async def _wait_idle(client: httpx.AsyncClient, kv_target: float | None, timeout: float,
                     t0: float) -> tuple[float, Sample | None]:
    """Wait until nothing runs or waits (and, given a target, KV used is back to it); the KV
    blocks used then (or at the timeout) and the last sample."""
    end = time.monotonic() + timeout
    last: Sample | None = None
    while True:
        last = await scrape(client, None, t0) or last
        if last is not None and last.running == 0 and last.waiting == 0 and (
                kv_target is None or last.kv_used == kv_target):
            return last.kv_used, last
        if time.monotonic() > end:
            return (last.kv_used if last is not None else float("nan")), last
        await asyncio.sleep(0.1)


async def _soak(client: httpx.AsyncClient, plan: SoakPlan, workload: Workload,
                t0: float) -> list[Outcome]:
    deadline = t0 + plan.duration_s
    outcomes: list[Outcome] = []

    async def one_client(i: int) -> None:
        rng = random.Random(plan.seed * 1000 + i)
        while time.perf_counter() < deadline:
            out = await send(client, workload.draw(rng), "soak", t0)
            outcomes.append(out)
            if out.outcome == "rejected":
                await asyncio.sleep(_retry_delay(out.retry_after))

    async def bursts() -> None:
        rng = random.Random(plan.seed * 1000 - 1)
        if plan.burst_every_s <= 0:
            return
        while True:
            await asyncio.sleep(plan.burst_every_s)
            if time.perf_counter() + 10 > deadline:
                return
            specs = [workload.normal(rng, "burst", BURST_TOKENS) for _ in range(plan.burst_size)]
            outcomes.extend(await asyncio.gather(*(send(client, s, "burst", t0) for s in specs)))

    await asyncio.gather(bursts(), *(one_client(i) for i in range(plan.clients)))
    return outcomes


def _shaped(workload: Workload, rng: random.Random, kind: str) -> RequestSpec:
    """One overload-shaped request: streamed, so TTFT is measured."""
    while True:
        spec = workload.normal(rng, kind, BURST_TOKENS)
        if spec.stream:
            return spec


async def _baseline(client: httpx.AsyncClient, plan: SoakPlan, workload: Workload,
                    t0: float) -> list[Outcome]:
    rngs = [random.Random(plan.seed * 1000 + 500 + i) for i in range(plan.baseline_clients)]
    per_client = max(plan.baseline_requests // plan.baseline_clients, 1)
    outcomes: list[Outcome] = []

    async def one_client(rng: random.Random) -> None:
        for _ in range(per_client):
            outcomes.append(await send(client, _shaped(workload, rng, "normal"), "baseline", t0))

    await asyncio.gather(*(one_client(r) for r in rngs))
    return outcomes


async def _overload(client: httpx.AsyncClient, plan: SoakPlan, workload: Workload,
                    t0: float) -> list[Outcome]:
    deadline = time.perf_counter() + plan.duration_s
    outcomes: list[Outcome] = []

    async def one_client(i: int) -> None:
        rng = random.Random(plan.seed * 1000 + 900 + i)
        await asyncio.sleep(rng.uniform(0, 1))  # arrivals spread, not one thundering herd
        while time.perf_counter() < deadline:
            out = await send(client, _shaped(workload, rng, "burst"), "overload", t0)
            outcomes.append(out)
            if out.outcome == "rejected":
                await asyncio.sleep(rng.uniform(*HAMMER_RETRY_S) if plan.ignore_retry_after
                                    else _retry_delay(out.retry_after) * rng.uniform(*RETRY_JITTER))

    await asyncio.gather(*(one_client(i) for i in range(plan.burst_size)))
    return outcomes


def _retry_delay(value: str | None) -> float:
    try:
        return min(max(float(value or 1), 0.0), 5.0)
    except ValueError:
        return 1.0
