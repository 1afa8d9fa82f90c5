"""Run the measurement groups, each side in its own child process, interleaved."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from localinfer.bench import startup
from localinfer.bench.load import competing_load
from localinfer.bench.plan import BenchPlan
from localinfer.bench.progress import Stage
from localinfer.errors import LocalInferError

NAMES = {"localinfer": "localinfer", "llamacpp": "llama.cpp"}


def run_child(side: str, group: str, plan: BenchPlan) -> dict[str, Any]:
    """One group in a fresh process; its progress goes straight to our stderr."""
    cmd = [sys.executable, "-m", "localinfer.bench.worker", side, group, plan.to_json()]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not lines or "error" in result:
        why = result.get("error") or f"exit status {proc.returncode}"
        raise LocalInferError(f"bench: {NAMES[side]} {group} group failed: {why}")
    return result


def run_all(plan: BenchPlan, peer: bool, peer_bench: str | None) -> dict[str, Any]:
    sides = ["localinfer", "llamacpp"] if peer else ["localinfer"]
    steps: list[tuple[str, str, Callable[[Stage], Any]]] = []
    for side in sides:
        probe = startup.measure_ours if side == "localinfer" else startup.measure_peer
        steps.append((side, "start", lambda st, probe=probe: probe(plan, st.show)))
    for group in ("single", "batch"):
        for side in sides:
            steps.append((side, group, lambda st, s=side, g=group: _child(s, g, plan, st)))
    if plan.structured:  # ours only: llama.cpp has no constrained decoding to compare
        steps.append(("localinfer", "structured",
                      lambda st: _child("localinfer", "structured", plan, st)))
    if peer_bench:
        from localinfer.bench import llama_bench

        steps.append(("llama_bench", "native", lambda st: llama_bench.run(peer_bench, plan)))

    raw: dict[str, Any] = {side: {} for side in sides}
    stage = Stage()
    titles = {"start": "start-up", "single": "single stream", "batch": "aggregate decode",
              "structured": "structured output", "native": "llama-bench binary"}
    for i, (side, group, fn) in enumerate(steps, 1):
        who = NAMES.get(side, "llama-bench")
        stage.prefix = f"[bench {i}/{len(steps)}] {who} {titles[group]}: "
        stage.show("starting")
        t0 = time.perf_counter()
        with competing_load(plan.load):  # started per step: nothing runs between them
            result = fn(stage)
        result["elapsed_s"] = time.perf_counter() - t0
        if side == "llama_bench":
            raw["llama_bench"] = result
        else:
            raw[side][group] = result
    stage.clear()
    if not peer:
        raw["llamacpp"] = None
    return raw


def _child(side: str, group: str, plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    plan.label = stage.prefix
    return run_child(side, group, plan)
