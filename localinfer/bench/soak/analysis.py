"""Outcomes and samples -> the soak's figures and its verdict (pure: tests feed it samples).

Checks, each a pass/fail with its numbers:
- no 5xx (client side, and in the server's own status counts), no error events in streams;
- nothing dropped: no transport errors or client timeouts; valid requests never get a 4xx,
  hostile ones always do;
- KV blocks in use once idle equal the baseline taken before the load;
- abort -> blocks free p99 under 1 s (from the server's histogram, this run's part of it);
- every 429/503 carries a Retry-After of whole seconds >= 0;
- RSS growth after warm-up under 5% (when the server's RSS could be read);
- overload only: accepted requests' p99 TTFT within 2x the unloaded run's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from localinfer.bench.soak.client import Outcome
from localinfer.bench.soak.sampler import Sample
from localinfer.server.loadgen import percentile

ABORT_P99_LIMIT_S = 1.0
RSS_GROWTH_LIMIT = 0.05
TTFT_RATIO_LIMIT = 2.0


@dataclass(slots=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class Analysis:
    figures: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "figures": self.figures,
                "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail}
                           for c in self.checks]}


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """The q-quantile of a cumulative histogram ({le: count}), linear within a bucket; inf
    when it falls in the +Inf bucket, nan when empty."""
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0.0
    if total <= 0:
        return math.nan
    target = q * total
    prev_le, prev_cum = 0.0, 0.0
    for le in edges:
        cum = buckets[le]
        if cum >= target:
            if math.isinf(le):
                return math.inf
            span = cum - prev_cum
            return prev_le + (le - prev_le) * ((target - prev_cum) / span if span else 1.0)
        prev_le, prev_cum = le, cum
    return math.inf


def bucket_delta(first: dict[float, float], last: dict[float, float]) -> dict[float, float]:
    return {le: v - first.get(le, 0.0) for le, v in last.items()}


def rss_figures(samples: list[Sample], warmup_s: float) -> dict[str, Any]:
    """RSS after warm-up: first, last, peak, growth over the run and its rate per hour (a
    least-squares slope, relative to the first)."""
    pts = [(s.t_s, s.rss_bytes) for s in samples if s.rss_bytes is not None and s.t_s >= warmup_s]
    if len(pts) < 2:
        return {"known": False}
    first, last = pts[0][1], pts[-1][1]
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mr = sum(r for _, r in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (r - mr) for t, r in pts) / var if var else 0.0
    return {"known": True, "after_warmup_mb": first / 2**20, "end_mb": last / 2**20,
            "peak_mb": max(r for _, r in pts) / 2**20, "growth": (last - first) / first,
            "growth_per_hour": slope * 3600 / first, "span_s": pts[-1][0] - pts[0][0]}


def analyse(outcomes: list[Outcome], samples: list[Sample], kv_baseline: float,
            kv_idle: float, warmup_s: float, baseline_ttft_p99: float | None = None) -> Analysis:
    by_outcome = Counter(o.outcome for o in outcomes)
    by_kind = Counter(f"{o.kind}:{o.outcome}" for o in outcomes)
    fives = [o for o in outcomes if o.status >= 500 and o.status != 503]  # 503: shedding
    server_fives = _server_5xx(samples)
    shed = [o for o in outcomes if o.outcome == "rejected"]
    missing_ra = [o for o in shed if not _valid_retry_after(o.retry_after)]
    ok_streamed = [o.ttft_s for o in outcomes if o.outcome == "ok" and o.ttft_s is not None
                   and o.kind != "hostile"]
    latencies = [o.latency_s for o in outcomes if o.outcome == "ok" and o.kind != "hostile"]
    aborts = (bucket_delta(samples[0].abort_buckets, samples[-1].abort_buckets)
              if samples else {})
    n_aborts = max(aborts.values()) if aborts else 0.0
    p50, p99 = histogram_quantile(aborts, 0.5), histogram_quantile(aborts, 0.99)
    bad_valid = [o for o in outcomes if o.kind != "hostile" and o.outcome == "client_error"]
    bad_hostile = [o for o in outcomes if o.kind == "hostile"
                   and not (400 <= o.status < 500) and o.outcome != "rejected"]
    dropped = [o for o in outcomes if o.outcome in ("transport_error", "timeout")]
    stream_errors = [o for o in outcomes if o.outcome == "stream_error"]
    rss = rss_figures(samples, warmup_s)
    ttft_p99 = percentile(ok_streamed, 0.99)
    figures: dict[str, Any] = {
        "requests": len(outcomes), "by_outcome": dict(by_outcome), "by_kind": dict(by_kind),
        "http_5xx": len(fives),
        "server_5xx_in_metrics": server_fives, "stream_errors": len(stream_errors),
        "rejections": len(shed), "rejections_with_retry_after": len(shed) - len(missing_ra),
        "rejections_by_status": dict(Counter(o.status for o in shed)),
        "kv_blocks_baseline": kv_baseline, "kv_blocks_idle_after": kv_idle,
        "kv_blocks_peak": max((s.kv_used for s in samples), default=math.nan),
        "kv_blocks_total": samples[-1].kv_total if samples else math.nan,
        "aborts_freed": n_aborts, "abort_to_free_p50_s": p50, "abort_to_free_p99_s": p99,
        "ttft_p50_s": percentile(ok_streamed, 0.5), "ttft_p90_s": percentile(ok_streamed, 0.9),
        "ttft_p99_s": ttft_p99, "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99), "rss": rss,
        "valid_requests_given_4xx": len(bad_valid), "hostile_not_4xx": len(bad_hostile),
        "dropped": len(dropped), "errors": sorted({o.error for o in (
            fives + stream_errors + bad_valid + bad_hostile + dropped) if o.error})[:8],
    }
    checks = [
        Check("no 5xx", not fives and not server_fives,
              f"{len(fives)} seen by clients, {server_fives:.0f} in the server's counts"),
        Check("no error events in streams", not stream_errors, f"{len(stream_errors)}"),
        Check("nothing dropped", not dropped,
              f"{len(dropped)} transport errors or client timeouts"),
        Check("valid requests never 4xx", not bad_valid, f"{len(bad_valid)}"),
        Check("hostile requests all 4xx", not bad_hostile, f"{len(bad_hostile)}"),
        Check("KV back to baseline when idle", kv_idle == kv_baseline,
              f"{kv_idle:.0f} blocks in use once idle, baseline {kv_baseline:.0f}"),
        Check("abort -> blocks free p99 < 1 s",
              n_aborts == 0 or (not math.isnan(p99) and p99 < ABORT_P99_LIMIT_S),
              f"p50 {secs(p50)}, p99 {secs(p99)} over {n_aborts:.0f} aborts"),
        Check("every rejection 429/503 with Retry-After", not missing_ra,
              f"{len(shed) - len(missing_ra)}/{len(shed)} carried it"),
    ]
    if rss["known"]:
        checks.append(Check("RSS growth after warm-up < 5%", rss["growth"] < RSS_GROWTH_LIMIT,
                            f"{rss['growth']:+.1%} over {rss['span_s']:.0f} s "
                            f"({rss['growth_per_hour']:+.1%}/h)"))
    if baseline_ttft_p99 is not None:
        ratio = ttft_p99 / baseline_ttft_p99 if baseline_ttft_p99 > 0 else math.inf
        figures["baseline_ttft_p99_s"] = baseline_ttft_p99
        figures["ttft_p99_ratio"] = ratio
        checks.append(Check("accepted p99 TTFT <= 2x unloaded", ratio <= TTFT_RATIO_LIMIT,
                            f"{secs(ttft_p99)} vs {secs(baseline_ttft_p99)} unloaded "
                            f"({ratio:.2f}x)"))
    return Analysis(figures, checks)


def _server_5xx(samples: list[Sample]) -> float:
    """5xx the server counted during the run, except 503s (load shedding, checked for
    Retry-After on the client side)."""
    if not samples:
        return 0.0
    first, last = samples[0].statuses, samples[-1].statuses
    return sum(v - first.get(k, 0.0) for k, v in last.items()
               if k.startswith("5") and k != "503")


def _valid_retry_after(value: str | None) -> bool:
    return value is not None and value.strip().isdigit()


def secs(v: float) -> str:
    """0.0123 -> '12 ms', 4.5 -> '4.50 s'; nan: 'n/a'; inf (the +Inf bucket): '> 10 s'."""
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "> 10 s"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
