"""Bench results -> metrics with ratios -> a table (stdout) and a JSON document (--json).

A ratio above 1 always means localinfer is better: ours/peer for tok/s, peer/ours for times
and memory. Aggregate decode is also given against llama.cpp's single-stream decode, the
comparison the performance targets use. The structured-output rows (--structured) are
localinfer's only; their ratio is constrained/unconstrained decode on the same engine.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from localinfer.atomic_file import atomic_write
from localinfer.bench import structured
from localinfer.bench.plan import STRUCTURED_COUNTS, BenchPlan

SIDES = ("localinfer", "llamacpp")
NAMES = {"localinfer": "localinfer", "llamacpp": "llama.cpp"}


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    group: str  # single, batch, start or structured
    field: str
    scale: float = 1.0  # display unit per stored unit (s -> ms: 1000)
    baseline: str | None = None  # ratio against this metric of ours, not against the peer


def metric_defs(plan: BenchPlan) -> list[Metric]:
    p = plan
    defs = [
        Metric("prefill_tps", f"prefill pp{p.pp_tokens}", "tok/s", True, "single", "prefill_tps"),
        Metric("decode_tps", f"decode tg{p.tg_tokens} (from position {p.tg_prompt})", "tok/s",
               True, "single", "decode_tps"),
        Metric("decode_tps_pos1000", f"decode tg{p.pos_tokens} at position {p.pos_prompt}",
               "tok/s", True, "single", "decode_tps_pos"),
    ]
    defs.append(Metric("stream_tps", "decode as `run` streams it (sampled, detokenized)",
                       "tok/s", True, "single", "stream_tps"))
    for n in p.agg_counts:
        label = f"aggregate decode, {n} sequence{'s' if n > 1 else ''}"
        defs.append(Metric(f"aggregate_tps_{n}", label, "tok/s", True, "batch",
                           f"aggregate_tps_{n}"))
    defs += [
        Metric("ttft_s", f"TTFT, {p.ttft_prompt}-token prompt", "ms", False, "single", "ttft_s",
               1000.0),
        Metric("peak_rss_mb_single", "peak RSS, single-stream process", "MB", False, "single",
               "peak_rss_mb"),
        Metric("peak_rss_mb_batch", f"peak RSS, {max(p.agg_counts)}-sequence process", "MB",
               False, "batch", "peak_rss_mb"),
        Metric("start_cold_s", "start to first token, " + (
            "cold JIT cache" if p.backend == "numba" else "first start"), "s", False, "start",
               "start_cold_s"),
        Metric("start_warm_s", "start to first token, " + (
            "warm cache" if p.backend == "numba" else "later starts"), "s", False, "start",
               "start_warm_s"),
    ]
    return defs + (structured_defs() if p.structured else [])


def structured_defs() -> list[Metric]:
    ms = 1000.0
    defs = [
        Metric("structured_added_mean_s", "structured: mask added per sequence-step, mean", "ms",
               False, "structured", "mask_added_mean_s", ms),
        Metric("structured_added_p99_s", "structured: mask added per sequence-step, p99", "ms",
               False, "structured", "mask_added_p99_s", ms),
        Metric("structured_first_mask_s", "structured: first mask of a new schema", "ms", False,
               "structured", "first_mask_s", ms),
        Metric("structured_tokenizer_s", "structured: llguidance tokenizer build, once per "
               "model", "ms", False, "structured", "ll_tokenizer_build_s", ms),
    ]
    for n in STRUCTURED_COUNTS:
        seqs = f"{n} sequence{'s' if n > 1 else ''}"
        defs += [
            Metric(f"unconstrained_tps_{n}", f"unconstrained decode, {seqs}", "tok/s", True,
                   "structured", f"unconstrained_tps_{n}"),
            Metric(f"structured_tps_{n}", f"structured decode, {seqs}", "tok/s", True,
                   "structured", f"structured_tps_{n}", baseline=f"unconstrained_tps_{n}"),
        ]
    return defs


def _value(raw: dict[str, Any] | None, m: Metric) -> float | None:
    if raw is None:
        return None
    v = raw.get(m.group, {}).get(m.field)
    return float(v["median"] if isinstance(v, dict) else v) if v is not None else None


def _ratio(ours: float | None, peer: float | None, higher: bool) -> float | None:
    if not ours or not peer:
        return None
    return ours / peer if higher else peer / ours


def build(plan: BenchPlan, raw: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: every metric for both sides, ratios, derived numbers, raw samples."""
    metrics: dict[str, Any] = {}
    peer_tg = _value(raw.get("llamacpp"), metric_defs(plan)[1])
    for m in metric_defs(plan):
        ours, peer = _value(raw["localinfer"], m), _value(raw.get("llamacpp"), m)
        entry: dict[str, Any] = {"label": m.label, "unit": "s" if m.unit == "ms" else m.unit,
                                 "higher_is_better": m.higher_is_better, "localinfer": ours,
                                 "llamacpp": peer,
                                 "ratio": _ratio(ours, peer, m.higher_is_better)}
        if m.group == "batch" and m.field.startswith("aggregate"):
            entry["ratio_vs_llamacpp_single"] = _ratio(ours, peer_tg, True)
        metrics[m.key] = entry
    for m in metric_defs(plan):
        if m.baseline is not None:
            e = metrics[m.key]
            e["ratio"] = _ratio(e["localinfer"], metrics[m.baseline]["localinfer"],
                                m.higher_is_better)
            e["ratio_of"] = m.baseline
    derived = {
        f"decode_pos{plan.pos_prompt}_over_pos{plan.tg_prompt}": {
            side: _ratio(metrics["decode_tps_pos1000"][side], metrics["decode_tps"][side], True)
            for side in SIDES}}
    return {"version": 1, "model": plan.model, "threads": plan.threads, "quick": plan.quick,
            "host": host_info(), "plan": asdict(plan), "metrics": metrics, "derived": derived,
            "llama_bench": raw.get("llama_bench"), "raw": raw}


def host_info() -> dict[str, Any]:
    versions = {}
    for pkg in ("localinfer", "numba", "llama_cpp_python"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"machine": platform.machine(), "processor": platform.processor(),
            "python": platform.python_version(), **versions}


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms" and v < 10:  # mask times are fractions of a millisecond
        return f"{v:.3f}" if v < 1 else f"{v:.2f}"
    return f"{v:.2f}" if unit == "s" else f"{v:.0f}" if unit in ("MB", "ms") else f"{v:.1f}"


def table(doc: dict[str, Any], plan: BenchPlan) -> str:
    has_peer = any(m["llamacpp"] is not None for m in doc["metrics"].values())
    has_ratio = has_peer or plan.structured
    lb = doc.get("llama_bench") or {}
    head = ["metric", "localinfer"] + (["llama.cpp"] if has_peer else [])
    head += ["ratio"] if has_ratio else []
    head += ["llama-bench"] if lb else []
    rows: list[list[str]] = []
    notes: list[str] = []
    for m in metric_defs(plan):
        e = doc["metrics"][m.key]
        ours = e["localinfer"] * m.scale if e["localinfer"] is not None else None
        peer = e["llamacpp"] * m.scale if e["llamacpp"] is not None else None
        row = [f"{m.label} ({m.unit})", _fmt(ours, m.unit)]
        row += [_fmt(peer, m.unit)] if has_peer else []
        row += [f"{e['ratio']:.2f}x" if e["ratio"] else "-"] if has_ratio else []
        if lb:
            native = lb.get(m.key) if m.key in ("prefill_tps", "decode_tps") else None
            row.append(_fmt(native["median"], m.unit) if native else "")
        if e.get("ratio_vs_llamacpp_single"):
            row.append(f"= {e['ratio_vs_llamacpp_single']:.2f}x llama.cpp 1-stream decode")
        rows.append(row)
    widths = [max(len(r[i]) for r in [head, *rows] if i < len(r)) for i in range(len(head))]

    def line(r: list[str]) -> str:
        cells = [c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) if i < len(widths)
                 else c for i, c in enumerate(r)]
        return "  ".join(cells).rstrip()

    out = [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    if has_peer:
        notes.append("ratio > 1: localinfer better (ours/peer for tok/s, peer/ours for "
                     "times and memory)")
        notes.append("aggregate, llama.cpp column: llama-cpp-python batched decode, one "
                     "sequence id per stream")
    for key, sides in doc["derived"].items():
        vals = ", ".join(f"{NAMES[s]} {v:.2f}" for s, v in sides.items() if v is not None)
        notes.append(f"{key.replace('_', ' ')}: {vals}")
    if plan.structured:
        notes.append("structured: localinfer only; ratio = constrained/unconstrained tok/s, "
                     f"same engine, greedy, {plan.agg_tokens} tokens per sequence on both")
        notes += structured.notes(doc["raw"]["localinfer"].get("structured"))
    notes.append("peak RSS: ru_maxrss of the child process that ran that group (interpreter, "
                 "libraries, weights, KV)")
    return "\n".join(out + [""] + notes)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    with atomic_write(path) as f:
        f.write(json.dumps(doc, indent=2).encode() + b"\n")
