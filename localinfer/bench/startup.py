"""JIT cold/warm start: wall time from process start to the first token on stdout.

localinfer: `localinfer run --max-tokens 1` (it writes the token, or the final newline, right
after the first token is sampled). Cold: an empty NUMBA_CACHE_DIR, so every kernel compiles, and
the repacked-weight and tokenizer caches off, so the weights are repacked and the tokenizer built
(a first start on a new machine); warm: the normal kernel, weight and tokenizer caches under
localinfer.paths, filled by an untimed run first. llama.cpp (and localinfer's llamacpp
backend): the same through llama-cpp-python in a fresh Python process (it has no JIT, so "cold"
is simply its first start).

Every probe runs in the environment a user's shell would give it: without
PYTHONDONTWRITEBYTECODE (set in some CI and container shells), which would make each start
compile every module of ours from source again (SmolLM2's warm start, medians of 4 on a 2-core
AMD EPYC: 1.18 and 1.14 s without bytecode, 1.00 and 1.07 s with it).  An installed package
has its bytecode; the untimed first run writes it for an editable one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from localinfer.bench.plan import BenchPlan
from localinfer.errors import LocalInferError


def user_env(**extra: str) -> dict[str, str]:
    """os.environ as a user's shell has it (bytecode written and read), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def first_output_s(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds from spawning `cmd` (in `env`, else user_env()) to its first byte on stdout;
    the command must succeed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env if env is not None else user_env())
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t1 = time.perf_counter()
    _, err = proc.communicate()
    if proc.returncode != 0 or not first:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise LocalInferError(f"bench: start-up probe failed ({tail[0]})")
    return t1 - t0


def ours_cmd(plan: BenchPlan) -> list[str]:
    cmd = [sys.executable, "-m", "localinfer", "run", "--model", plan.model, "--backend",
            plan.backend, "--threads", str(plan.threads), "--max-tokens", "1", "--raw", "Hello"]
    if plan.n_gpu_layers:
        cmd += ["--n-gpu-layers", str(plan.n_gpu_layers)]
    if plan.backend == "llamacpp" and plan.flash_attn is not None:
        cmd += ["--flash-attn", "on" if plan.flash_attn else "off"]
    return cmd


def peer_cmd(plan: BenchPlan) -> list[str]:
    return [sys.executable, "-m", "localinfer.bench.worker", "llamacpp", "start",
            plan.to_json()]


def measure(cmd: list[str], plan: BenchPlan, cold_env: dict[str, str] | None,
            show: Any) -> dict[str, Any]:
    """cold (one run, with cold_env if given) then warm (plan.start_reps runs, median)."""
    if cold_env is not None:
        show("filling the kernel cache (untimed)")
        first_output_s(cmd)
        show("cold start (empty kernel cache)")
        cold = first_output_s(cmd, cold_env)
    else:
        show("first start")
        cold = first_output_s(cmd)
    warm = []
    for r in range(plan.start_reps):
        show(f"warm start ({r + 1}/{plan.start_reps})")
        warm.append(first_output_s(cmd))
    return {"start_cold_s": {"median": cold, "samples": [cold]},
            "start_warm_s": {"median": statistics.median(warm), "samples": warm}}


def measure_ours(plan: BenchPlan, show: Any) -> dict[str, Any]:
    if plan.backend != "numba":  # no JIT: "cold" is simply the first start
        return measure(ours_cmd(plan), plan, None, show)
    with tempfile.TemporaryDirectory(prefix="localinfer-bench-jit-") as empty:
        env = user_env(NUMBA_CACHE_DIR=empty, LOCALINFER_WEIGHT_CACHE="0",
                       LOCALINFER_TOKENIZER_CACHE="0")
        return measure(ours_cmd(plan), plan, env, show)


def measure_peer(plan: BenchPlan, show: Any) -> dict[str, Any]:
    return measure(peer_cmd(plan), plan, None, show)
