"""The native llama.cpp peer: run a `llama-bench` binary (-p 512 -n 128 -t N -o json)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from localinfer.bench.plan import BenchPlan
from localinfer.errors import LocalInferError


def command(binary: str, plan: BenchPlan) -> list[str]:
    return [binary, "-m", plan.model, "-p", str(plan.pp_tokens), "-n", str(plan.tg_tokens),
            "-t", str(plan.threads), "-r", "1" if plan.quick else "5", "-o", "json"]


def parse(text: str) -> dict[str, Any]:
    """llama-bench's JSON (a list of test records) -> prefill/decode tok/s and build info."""
    start = text.find("[")
    try:
        records = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as exc:
        raise LocalInferError(f"bench: cannot parse llama-bench output: {exc}") from exc
    if not isinstance(records, list):
        raise LocalInferError("bench: llama-bench printed no JSON list of results")
    out: dict[str, Any] = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        n_prompt, n_gen = int(rec.get("n_prompt", 0)), int(rec.get("n_gen", 0))
        key = "prefill_tps" if n_prompt and not n_gen else "decode_tps" if n_gen else None
        if key is None:
            continue
        out[key] = {"median": float(rec["avg_ts"]), "stddev": float(rec.get("stddev_ts", 0.0)),
                    "n_tokens": n_prompt or n_gen}
        for field in ("build_commit", "cpu_info", "n_threads", "backends"):
            if field in rec:
                out.setdefault("info", {})[field] = rec[field]
    if "prefill_tps" not in out or "decode_tps" not in out:
        raise LocalInferError("bench: llama-bench output lacks the pp and tg results")
    return out


def run(binary: str, plan: BenchPlan) -> dict[str, Any]:
    try:
        proc = subprocess.run(command(binary, plan), capture_output=True, text=True,
                              timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalInferError(f"bench: cannot run llama-bench {binary}: {exc}") from exc
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise LocalInferError(f"bench: llama-bench failed: {tail[0]}")
    return parse(proc.stdout)
