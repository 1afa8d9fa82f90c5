"""One measurement group in a child process: `python -m localinfer.bench.worker SIDE GROUP PLAN`.

SIDE is localinfer or llamacpp, GROUP is single, batch, start or structured (localinfer only),
PLAN a BenchPlan as JSON.
The last line on stdout is one JSON object: the group's numbers plus this process's peak RSS,
or {"error": ...}. The start group instead writes the first generated token to stdout as soon
as it exists, for the parent to time from process start (llama.cpp side only; the localinfer
side is timed on `localinfer run`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from typing import Any

from localinfer.bench.plan import BenchPlan
from localinfer.bench.progress import Stage


def peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)  # macOS reports bytes


def start_llamacpp(plan: BenchPlan) -> None:
    """Load, prefill a short prompt, write the first greedy token: time to first token."""
    import llama_cpp

    from localinfer.bench.peer_llamacpp import last_argmax

    llm = llama_cpp.Llama(model_path=plan.model, n_ctx=2048, n_batch=512,
                          n_threads=plan.threads, n_threads_batch=plan.threads, verbose=False)
    llm.eval(llm.tokenize(b"Hello"))
    tok = last_argmax(llm)
    sys.stdout.buffer.write(llm.detokenize([tok]) or b" ")
    sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    llm.close()


def run_group(side: str, group: str, plan: BenchPlan) -> dict[str, Any]:
    stage = Stage(plan.label)
    result: dict[str, Any]
    if group == "structured":  # localinfer's only: llama.cpp has nothing comparable
        if side != "localinfer":
            raise ValueError("the structured group runs on the localinfer side only")
        from localinfer.bench import structured

        result = structured.run(plan, stage)
    else:
        if side == "localinfer":
            from localinfer.bench import runner_ours as mod
        elif side == "llamacpp":
            from localinfer.bench import peer_llamacpp as mod  # type: ignore[no-redef]
        else:
            raise ValueError(f"unknown side {side!r}")
        result = mod.single(plan, stage) if group == "single" else mod.batch(plan, stage)
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def main(argv: list[str]) -> int:
    side, group, plan_json = argv
    plan = BenchPlan.from_json(plan_json)
    if group == "start":
        start_llamacpp(plan)
        return 0
    try:
        result = run_group(side, group, plan)
    except Exception as exc:  # reported to the parent, which prints one line
        if os.environ.get("LOCALINFER_DEBUG"):
            traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
