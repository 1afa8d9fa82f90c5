"""Prometheus metrics, in a CollectorRegistry of the app's own (several apps, one process).

Per-request figures (TTFT, time per output token, end-to-end latency, HTTP status counts) are
observed by the routes, abort-to-free seconds by the engine loops' threads; engine figures
(queue, running, KV blocks, prefix-cache hit rate, token totals, speculative decoding's guessed
and accepted tokens and verifications) are read from each loaded model's engine loop's latest
stats snapshot at scrape time, labelled with the model's id (`model="..."`); a model's counters
start again from 0 when it is reloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
# a free waits at most for the engine step in progress: milliseconds, a second is too slow
_ABORT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.175, 0.25, 0.375, 0.5, 0.75,
                  1, 1.5, 2.5, 5, 10)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("localinfer_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("localinfer_time_to_first_token_seconds",
                              "Request arrival to first generated token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("localinfer_time_per_output_token_seconds",
                              "Mean time between output tokens of a request",
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("localinfer_e2e_request_latency_seconds",
                             "Request arrival to last token", buckets=_LATENCY_BUCKETS,
                             registry=self.registry)
        self.abort_to_free = Histogram(
            "localinfer_abort_to_free_seconds",
            "A request's abort (client gone, timeout, shutdown) to its KV blocks being free, "
            "per sequence the engine held", buckets=_ABORT_BUCKETS, registry=self.registry)

    def watch_engines(self, source: Callable[[], list[tuple[Any, Any, int, int]]],
                      labels: tuple[str, ...] = ("model",)) -> None:
        """`source()` lists (model id, EngineStats, queued-not-admitted count, http requests
        in flight) for each loaded model; every engine figure carries a `model` label. With
        more `labels` (a cluster's ("model", "replica")) the first field is their values."""
        self.registry.register(_EngineCollector(source, labels))

    def observe(self, arrival: float, first: float | None, last: float, n_tokens: int) -> None:
        self.e2e.observe(max(last - arrival, 0.0))
        if first is not None:
            self.ttft.observe(max(first - arrival, 0.0))
            if n_tokens > 1:
                self.tpot.observe(max(last - first, 0.0) / (n_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, source: Callable[[], Any], labels: tuple[str, ...]) -> None:
        self.source = source
        self.labels = list(labels)

    def describe(self) -> list[Metric]:
        return []  # collected lazily; names are not known before the model loads

    def collect(self) -> Iterator[Metric]:
        snapshots = self.source()
        if not snapshots:
            return
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for key, stats, queued, in_flight in snapshots:
            values = list(key) if isinstance(key, tuple) else [key]
            for kind, name, doc, value in _figures(stats, queued, in_flight):
                if name not in families:
                    families[name] = kind(name, doc, labels=self.labels)
                families[name].add_metric(values, float(value))
        yield from families.values()


def _figures(stats: Any, queued: int, in_flight: int) -> Iterator[tuple[Any, str, str, float]]:
    """Each engine figure: (family class, name, help, value)."""
    gauges = {
        "localinfer_num_requests_waiting": ("Requests queued for the engine",
                                            stats.num_waiting + queued),
        "localinfer_num_requests_running": ("Sequences the engine is running",
                                            stats.num_running),
        "localinfer_prefill_backlog_tokens": ("Prompt tokens admitted but not computed yet",
                                              stats.prefill_backlog_tokens),
        "localinfer_http_requests_in_flight": ("Generation requests being served",
                                               in_flight),
        "localinfer_kv_blocks_used": ("KV cache blocks in use", stats.kv_blocks_used),
        "localinfer_kv_blocks_total": ("KV cache blocks in the pool", stats.kv_blocks_total),
        "localinfer_kv_cache_usage_ratio": ("Fraction of KV blocks in use", stats.kv_usage),
        "localinfer_prefix_cache_hit_rate": ("Prompt tokens served from the prefix cache "
                                             "/ prompt tokens looked up",
                                             stats.prefix_cache_hit_rate),
        "localinfer_spec_decode_acceptance_rate": ("Speculative tokens accepted / guessed",
                                                   stats.spec_acceptance_rate),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily, name, doc, value
    counters = {
        "localinfer_prompt_tokens": ("Prompt tokens of all requests",
                                     stats.prompt_tokens_total),
        "localinfer_generation_tokens": ("Tokens generated", stats.generation_tokens_total),
        "localinfer_preemptions": ("Sequences preempted for lack of KV blocks",
                                   stats.num_preemptions),
        "localinfer_prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache",
                                               stats.prefix_cache_hit_tokens),
        "localinfer_prefix_cache_queried_tokens": ("Prompt tokens looked up in the prefix "
                                                   "cache", stats.prefix_cache_queried_tokens),
        "localinfer_spec_decode_num_draft_tokens": ("Speculative tokens guessed and verified",
                                                    stats.spec_proposed_tokens),
        "localinfer_spec_decode_num_accepted_tokens": ("Speculative tokens accepted",
                                                       stats.spec_accepted_tokens),
        "localinfer_spec_decode_num_verifications": ("Verifications of speculative tokens",
                                                     stats.spec_verifications),
    }
    for name, (doc, value) in counters.items():
        yield CounterMetricFamily, name, doc, value


_OPENAI = ("/chat/completions", "/completions", "/models", "/responses")
_ROUTES = frozenset({*(f"/v1{p}" for p in _OPENAI), *_OPENAI, "/infill", "/health",
                     "/metrics", "/tokenize", "/detokenize", "/api/version", "/api/tags",
                     "/api/show", "/api/ps", "/api/pull", "/api/delete", "/api/unload",
                     "/api/chat", "/api/generate"})


class MetricsMiddleware:
    """Counts responses by route and status (a pure ASGI middleware: streaming-safe)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in _ROUTES else "other"

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
