"""`localinfer bench`: it runs end to end on a tiny and on the real model, writes every metric
for both sides, and prints the ratio column. No timing assertions: machines are noisy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama

from localinfer.bench import llama_bench, report, structured
from localinfer.bench.plan import AGGREGATE_COUNTS, STRUCTURED_COUNTS, BenchPlan
from localinfer.errors import LocalInferError

METRICS = [  # and aggregate_tps_N for each --aggregate count
    "prefill_tps", "decode_tps", "decode_tps_pos1000", "ttft_s", "peak_rss_mb_single",
    "peak_rss_mb_batch", "start_cold_s", "start_warm_s",
]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "--quick", "--threads", "1", *args],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )


def check_run(model: Path, out: Path, aggregate: str | None = None) -> None:
    """One whole bench; `aggregate`: its --aggregate counts (else the defaults)."""
    pytest.importorskip("llama_cpp")
    extra = ["--aggregate", aggregate] if aggregate else []
    proc = bench("--model", str(model), "--json", str(out), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["threads"] == 1 and doc["quick"] is True
    counts = sorted(int(n) for n in aggregate.split(",")) if aggregate else AGGREGATE_COUNTS
    for key in [*METRICS, *(f"aggregate_tps_{n}" for n in counts)]:
        m = doc["metrics"][key]
        for side in ("localinfer", "llamacpp", "ratio"):
            assert isinstance(m[side], float) and m[side] > 0, (key, side, m)
        if key.startswith("aggregate"):
            assert m["ratio_vs_llamacpp_single"] > 0
    assert all(v > 0 for v in next(iter(doc["derived"].values())).values())
    stream = doc["metrics"]["stream_tps"]  # what `run` shows: ours only
    assert stream["localinfer"] > 0 and stream["llamacpp"] is None
    header = proc.stdout.splitlines()[1].split()
    assert header == ["metric", "localinfer", "llama.cpp", "ratio"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("aggregate decode")]
    # one row a count, smallest first, whatever order they were asked in
    assert [r.split(",")[1].split("(")[0].strip() for r in rows] == [
        f"{n} sequence{'s' if n > 1 else ''}" for n in counts]
    assert "pp512" in proc.stdout
    assert "[bench 1/6]" in proc.stderr  # the progress display
    assert not list(out.parent.glob(f".{out.name}.*"))  # atomic write left no temp file


def test_bench_tiny_model(tmp_path: Path) -> None:
    """With its own --aggregate counts, unsorted (the real model's run has the defaults);
    a bad list is refused."""
    model = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=2048)
    check_run(model, tmp_path / "bench.json", aggregate="3,2")
    bad = bench("--model", str(model), "--aggregate", "0,x")
    assert bad.returncode != 0 and "invalid --aggregate" in bad.stderr


@pytest.mark.slow
def test_bench_real_model(smollm2_path: Path, tmp_path: Path) -> None:
    check_run(smollm2_path, tmp_path / "bench.json")


def test_plan_shrinks_for_short_context() -> None:
    plan = BenchPlan.make("m.gguf", 2, n_ctx_train=256, quick=False)
    assert plan.pp_tokens == 255 and plan.pos_prompt + plan.pos_tokens < 256
    assert plan.tg_prompt + plan.tg_tokens < 256 and plan.single_ctx >= 256
    with pytest.raises(ValueError):
        BenchPlan.make("m.gguf", 2, n_ctx_train=16, quick=True)


def test_table_without_peer() -> None:
    plan = BenchPlan.make("m.gguf", 2, n_ctx_train=4096, quick=True)
    value = {"median": 2.0, "samples": [2.0]}
    single = {k: value for k in ("prefill_tps", "decode_tps", "decode_tps_pos", "ttft_s")}
    batch = {f"aggregate_tps_{n}": value for n in plan.agg_counts}
    start = {"start_cold_s": value, "start_warm_s": value}
    raw = {"localinfer": {"single": {**single, "peak_rss_mb": 100.0},
                          "batch": {**batch, "peak_rss_mb": 120.0}, "start": start},
           "llamacpp": None}
    doc = report.build(plan, raw)
    assert doc["metrics"]["ttft_s"]["localinfer"] == 2.0 and doc["metrics"]["ttft_s"]["ratio"] is None
    text = report.table(doc, plan)
    assert text.splitlines()[0].split() == ["metric", "localinfer"]
    assert "2000" in text  # TTFT shown in ms


def test_structured_group(smollm2_path: Path) -> None:
    """The --structured group in its worker process, quick sizes: every row positive, and the
    constrained runs decoded the full token budget (the endless schema never completes)."""
    pytest.importorskip("llguidance")
    plan = BenchPlan.make(str(smollm2_path), 1, n_ctx_train=2048, quick=True)
    plan.structured = True
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer.bench.worker", "localinfer", "structured",
         plan.to_json()], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(proc.stdout.splitlines()[-1])
    for n in STRUCTURED_COUNTS:
        assert result[f"structured_tokens_{n}"] == n * plan.agg_tokens
        assert result[f"mask_added_{n}"]["n"] == n * plan.agg_tokens  # each step masks
    doc = report.build(plan, {"localinfer": {"structured": result}, "llamacpp": None})
    for m in report.structured_defs():
        assert doc["metrics"][m.key]["localinfer"] > 0, m.key
        assert doc["metrics"][m.key]["llamacpp"] is None
    for n in STRUCTURED_COUNTS:
        assert doc["metrics"][f"structured_tps_{n}"]["ratio"] > 0
    text = report.table(doc, plan)
    assert text.splitlines()[0].split() == ["metric", "localinfer", "ratio"]
    assert "structured: first mask of a new schema (ms)" in text
    assert "structured decode, 16 sequences (tok/s)" in text
    assert "structured: mask added per sequence-step, mean / p99 (ms): 1 seq" in text
    assert "like-for-like" not in text
    short = structured.notes({**result, "structured_tokens_1": 3})
    assert short[-1] == (f"structured decode, 1 sequence: only 3 of {plan.agg_tokens} tokens, "
                         "not a like-for-like comparison")


LLAMA_BENCH_JSON = """[
  {"build_commit": "abc123", "n_threads": 2, "n_prompt": 512, "n_gen": 0,
   "avg_ts": 470.5, "stddev_ts": 3.1, "cpu_info": "AMD"},
  {"build_commit": "abc123", "n_threads": 2, "n_prompt": 0, "n_gen": 128,
   "avg_ts": 170.25, "stddev_ts": 1.0, "cpu_info": "AMD"}
]"""


def test_llama_bench_output_is_parsed(tmp_path: Path) -> None:
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('''{LLAMA_BENCH_JSON}''')\n"
                    "sys.stderr.write(' '.join(sys.argv[1:]))\n")
    fake.chmod(0o755)
    plan = BenchPlan.make("m.gguf", 2, n_ctx_train=4096, quick=True)
    out = llama_bench.run(str(fake), plan)
    assert out["prefill_tps"]["median"] == 470.5 and out["decode_tps"]["median"] == 170.25
    assert out["info"]["build_commit"] == "abc123"
    assert llama_bench.command("lb", plan)[-2:] == ["-o", "json"]
    with pytest.raises(Exception, match="llama-bench"):
        llama_bench.parse("no json here")


def test_competing_load_runs_busy_processes_and_stops_them() -> None:
    """--load N: N processes really compete for the CPU during a step and are gone after."""
    import time

    from localinfer.bench.load import competing_load

    with competing_load(2) as procs:
        assert len(procs) == 2
        time.sleep(0.5)
        busy = []
        for p in procs:
            with open(f"/proc/{p.pid}/stat") as f:
                utime = int(f.read().rsplit(")", 1)[1].split()[11])  # field 14: user ticks
            busy.append(utime)
            assert p.poll() is None
    assert sum(busy) > 0  # they burned CPU, not slept
    assert all(p.poll() is not None for p in procs)
    with competing_load(0) as none:
        assert none == []


def test_load_option_is_recorded_and_checked(tmp_path: Path) -> None:
    bad = bench("--load", "-1", "--peer", "none")
    assert bad.returncode != 0 and "--load" in bad.stderr
    plan = BenchPlan(model="m.gguf", threads=1, load=3)
    assert BenchPlan.from_json(plan.to_json()).load == 3


def test_start_probe_runs_in_a_users_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start-up probe's child gets the caller's environment minus PYTHONDONTWRITEBYTECODE (a
    user's install has bytecode; recompiling our modules at each start cost SmolLM2 0.07-0.18 s
    of ~1.1 s), with a cold run's extra variables on top."""
    from localinfer.bench import startup

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("LOCALINFER_PROBE_MARK", "kept")
    probe = [sys.executable, "-c", "import os, sys; sys.stdout.write(repr(["
             "os.environ.get('PYTHONDONTWRITEBYTECODE'), os.environ.get('LOCALINFER_PROBE_MARK'),"
             " os.environ.get('NUMBA_CACHE_DIR')]))"]
    out = subprocess.run(probe, env=startup.user_env(NUMBA_CACHE_DIR="/x"), capture_output=True,
                         text=True, check=True).stdout
    assert out == "[None, 'kept', '/x']"
    # the default environment is user_env(): this child fails (and the probe raises) if not
    clean = [sys.executable, "-c", "import os, sys; sys.exit(1) if 'PYTHONDONTWRITEBYTECODE' "
             "in os.environ else sys.stdout.write('ok')"]
    assert startup.first_output_s(clean) > 0
    with pytest.raises(LocalInferError, match="start-up probe failed"):
        startup.first_output_s(clean, dict(os.environ))
