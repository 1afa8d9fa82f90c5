"""The soak's readable report: what ran, the figures, then each check with PASS/FAIL."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from localinfer.bench.soak.analysis import secs
from localinfer.bench.soak.run import RunResult


def table(result: RunResult) -> str:
    f = result.analysis.figures
    p = result.plan
    if result.mode == "overload":
        head = (f"bench soak --overload: {result.model} at {p.url}, {p.burst_size} clients "
                f"({p.burst_factor:g}x capacity {p.capacity}) for {p.duration_s:.0f} s, "
                f"back {'50-250 ms' if p.ignore_retry_after else 'Retry-After +-25%'} "
                f"after a rejection; unloaded baseline: {p.baseline_requests} requests from "
                f"{p.baseline_clients} client(s)")
    else:
        head = (f"bench soak: {result.model} at {p.url}, {p.clients} clients for "
                f"{p.duration_s:.0f} s, {p.disconnect_rate:.0%} disconnecting, "
                f"{p.hostile_rate:.0%} hostile, bursts of {p.burst_size} every "
                f"{p.burst_every_s:g} s")
    rows = [
        ("requests", f"{f['requests']} in {result.wall_s:.0f} s"),
        ("by outcome", _counts(f["by_outcome"])),
        ("by kind", _counts(f["by_kind"])),
        ("5xx", f"{f['http_5xx']} (server's own count: {f['server_5xx_in_metrics']:.0f})"),
        ("rejections", f"{f['rejections']} {_counts(f['rejections_by_status'])}, "
                       f"{f['rejections_with_retry_after']} with Retry-After"),
        ("KV blocks in use", f"baseline {f['kv_blocks_baseline']:.0f}, idle after "
                             f"{f['kv_blocks_idle_after']:.0f}, peak {f['kv_blocks_peak']:.0f} "
                             f"of {f['kv_blocks_total']:.0f}"),
        ("abort -> blocks free", f"p50 {secs(f['abort_to_free_p50_s'])}, p99 "
                                 f"{secs(f['abort_to_free_p99_s'])} "
                                 f"({f['aborts_freed']:.0f} aborts)"),
        ("TTFT (streamed, ok)", f"p50 {secs(f['ttft_p50_s'])}, p90 {secs(f['ttft_p90_s'])}, "
                                f"p99 {secs(f['ttft_p99_s'])}"),
        ("latency (ok)", f"p50 {secs(f['latency_p50_s'])}, p99 {secs(f['latency_p99_s'])}"),
        ("server RSS", _rss(f["rss"])),
    ]
    if "baseline_ttft_p99_s" in f:
        rows.append(("unloaded TTFT p99", f"{secs(f['baseline_ttft_p99_s'])} "
                                          f"(accepted under overload: {f['ttft_p99_ratio']:.2f}x)"))
    width = max(len(k) for k, _ in rows)
    lines = [head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)]
    for c in result.analysis.checks:
        lines.append(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}")
    for e in f["errors"]:
        lines.append(f"  error: {e}")
    lines.append("verdict: " + ("PASS" if result.analysis.passed else "FAIL"))
    return "\n".join(lines)


def write_json(path: Path, result: RunResult) -> None:
    path.write_text(json.dumps(_finite(result.to_dict()), indent=1))


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _counts(d: dict[Any, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: str(kv[0])))


def _rss(r: dict[str, Any]) -> str:
    if not r.get("known"):
        return "unknown (no server pid: pass --server-pid, or let the soak start the server)"
    return (f"{r['after_warmup_mb']:.0f} MB after warm-up -> {r['end_mb']:.0f} MB "
            f"(peak {r['peak_mb']:.0f}), {r['growth']:+.1%} over {r['span_s']:.0f} s, "
            f"{r['growth_per_hour']:+.1%}/h")
