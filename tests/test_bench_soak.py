"""`localinfer bench soak`: the analysis on synthetic samples (each check catches its failure),
the metrics it reads from a real ServerMetrics, the workload's mix, a short soak against a real
server it starts, and one against a server whose engine fails (the verdict says FAIL)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from localinfer.bench.soak.analysis import analyse, histogram_quantile, rss_figures
from localinfer.bench.soak.client import Outcome, send
from localinfer.bench.soak.main import parse_duration, server_options
from localinfer.bench.soak.sampler import Sample, parse_metrics
from localinfer.bench.soak.workload import HOSTILE_KINDS, Workload
from localinfer.errors import InvalidRequestError

INF = math.inf


def _ok(i: int, ttft: float = 0.1) -> Outcome:
    return Outcome("soak", "normal", "/v1/completions", True, float(i), "ok", 200, ttft, 1.0)


def _samples(kv_idle: float = 0, rss: tuple[int, int] = (100 << 20, 100 << 20),
             aborts: dict[float, float] | None = None,
             statuses: dict[str, float] | None = None) -> list[Sample]:
    first = Sample(0.0, 0, 64, 0, 0, rss[0], {"200": 0}, {0.1: 0, 1.0: 0, INF: 0})
    mid = Sample(100.0, 30, 64, 4, 1, rss[0], {"200": 50}, {0.1: 0, 1.0: 0, INF: 0})
    last = Sample(200.0, kv_idle, 64, 0, 0, rss[1], statuses or {"200": 100},
                  aborts or {0.1: 9, 1.0: 10, INF: 10})
    return [first, mid, last]


def _check(analysis, name: str) -> bool:
    return next(c.passed for c in analysis.checks if c.name.startswith(name))


def test_a_clean_run_passes() -> None:
    outcomes = [_ok(i) for i in range(100)]
    shed = Outcome("burst", "burst", "/v1/completions", True, 5.0, "rejected", 429,
                   retry_after="1")
    a = analyse([*outcomes, shed], _samples(), 0, 0, warmup_s=10)
    assert a.passed, a.checks
    f = a.figures
    assert f["requests"] == 101 and f["rejections_with_retry_after"] == 1
    assert f["aborts_freed"] == 10 and 0 < f["abort_to_free_p50_s"] < 0.1
    assert f["rss"]["growth"] == 0


def test_each_check_catches_its_failure() -> None:
    good = [_ok(i) for i in range(20)]
    five = Outcome("soak", "normal", "/v1/completions", False, 1.0, "server_error", 500)
    assert not _check(analyse([*good, five], _samples(), 0, 0, 10), "no 5xx")
    # a 5xx the server counted but no client saw (e.g. a request we hung up on)
    assert not _check(analyse(good, _samples(statuses={"200": 100, "500": 1}), 0, 0, 10),
                      "no 5xx")
    assert not _check(analyse(good, _samples(kv_idle=3), 0, 3, 10), "KV back")
    bare = Outcome("burst", "burst", "/v1/completions", True, 5.0, "rejected", 503)
    assert not _check(analyse([*good, bare], _samples(), 0, 0, 10), "every rejection")
    slow = {0.1: 1, 1.0: 5, INF: 10}  # half the frees took more than a second
    assert not _check(analyse(good, _samples(aborts=slow), 0, 0, 10), "abort")
    leak = _samples(rss=(100 << 20, 120 << 20))
    assert not _check(analyse(good, leak, 0, 0, 10), "RSS growth")
    cut = Outcome("soak", "normal", "/v1/completions", True, 1.0, "stream_error", 200)
    assert not _check(analyse([*good, cut], _samples(), 0, 0, 10), "no error events")
    dropped = Outcome("soak", "normal", "/v1/completions", True, 1.0, "transport_error")
    assert not _check(analyse([*good, dropped], _samples(), 0, 0, 10), "nothing dropped")
    accepted = Outcome("soak", "hostile", "/v1/completions", False, 1.0, "ok", 200,
                       hostile="bad_token_ids")
    assert not _check(analyse([*good, accepted], _samples(), 0, 0, 10), "hostile")
    refused = Outcome("soak", "normal", "/v1/completions", False, 1.0, "client_error", 400)
    assert not _check(analyse([*good, refused], _samples(), 0, 0, 10), "valid requests")
    slow_ttft = [_ok(i, ttft=0.5) for i in range(20)]
    a = analyse(slow_ttft, _samples(), 0, 0, 10, baseline_ttft_p99=0.1)
    assert not _check(a, "accepted p99 TTFT") and a.figures["ttft_p99_ratio"] == pytest.approx(5)
    assert not any(not c.passed for c in analyse(good, _samples(), 0, 0, 10).checks)


def test_histogram_quantile_and_rss_slope() -> None:
    buckets = {0.01: 50, 0.1: 90, 1.0: 100, INF: 100}
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.01)
    assert histogram_quantile(buckets, 0.95) == pytest.approx(0.1 + 0.9 * 0.5)
    assert histogram_quantile({0.1: 0, INF: 3}, 0.5) == INF
    assert math.isnan(histogram_quantile({0.1: 0, INF: 0}, 0.5))
    # 1 MB a minute on 600 MB: +10%/h; samples before the warm-up are left out
    samples = [Sample(float(t), 0, 1, 0, 0, (900 if t < 60 else 600 + (t - 60) // 60) << 20)
               for t in range(0, 660, 10)]
    r = rss_figures(samples, warmup_s=60)
    assert r["after_warmup_mb"] == 600 and r["growth_per_hour"] == pytest.approx(0.1, rel=0.1)


def test_parse_metrics_reads_a_real_server_registry() -> None:
    from localinfer.server.metrics import ServerMetrics

    m = ServerMetrics()
    for seconds in (0.002, 0.03, 0.4, 3.0):
        m.abort_to_free.observe(seconds)
    m.requests.labels("/v1/completions", "200").inc(7)
    m.requests.labels("/v1/completions", "429").inc(2)
    m.requests.labels("/metrics", "200").inc(5)  # the soak's own scrapes are not counted
    s = parse_metrics(m.render().decode(), 1.0, None)
    assert s.statuses == {"200": 7.0, "429": 2.0}
    assert s.abort_buckets[INF] == 4 and s.abort_buckets[0.0025] == 1
    assert s.abort_buckets[1.0] == 3
    assert math.isnan(s.kv_used)  # no engine loaded: absent, not 0


def test_workload_mix_and_hostile_bodies() -> None:
    w = Workload("m", 512)
    rng = random.Random(7)
    specs = [w.draw(rng) for _ in range(4000)]
    kinds = {k: sum(s.kind == k for s in specs) / len(specs) for k in ("disconnect", "hostile")}
    assert 0.17 < kinds["disconnect"] < 0.23 and 0.035 < kinds["hostile"] < 0.065
    points = {s.disconnect for s in specs if s.kind == "disconnect"}
    assert points == {"early", "prefill", "mid_stream", "read_timeout"}
    assert {s.hostile for s in specs if s.kind == "hostile"} == set(HOSTILE_KINDS)
    long = w.hostile(rng, "overlong_prompt")
    assert len(long.body) > 2 * 512 * 2  # words of 2+ characters
    assert len(w.hostile(rng, "oversized_body").body) > 16 << 20
    with pytest.raises(InvalidRequestError):
        parse_duration("-3m")
    assert parse_duration("2m") == 120 and parse_duration("45") == 45


def test_own_server_options() -> None:
    """The soak's own server: --overload admits only what runs at once and one prompt's
    prefill at a time (its TTFT target depends on it); each can be set or turned off."""
    from localinfer.cli import build_parser

    def argv(*extra: str) -> list[str]:
        args = build_parser("bench").parse_args(["bench", "soak", *extra])
        return server_options(args).argv(8000)

    plain, over = argv(), argv("--overload")
    assert plain[plain.index("--max-queue") + 1] == "16" and "--max-prefill-backlog" not in plain
    assert over[over.index("--max-queue") + 1] == "0"
    assert over[over.index("--max-prefill-backlog") + 1] == "0"
    assert "--max-prefill-backlog" not in argv("--overload", "--max-prefill-backlog", "-1")
    tuned = argv("--max-prefill-backlog", "256", "--max-queue", "4")
    assert tuned[tuned.index("--max-prefill-backlog") + 1] == "256"
    assert tuned[tuned.index("--max-queue") + 1] == "4"


def test_abort_to_free_metric_on_a_real_disconnect(server) -> None:
    """The histogram the soak reads: a client hanging up mid-stream is one observation."""
    def count() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return parse_metrics(text, 0, None).abort_buckets.get(INF, 0.0)

    before = count()
    body = {"prompt": "Tell me a long story.", "max_tokens": 300, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data:"):
            pass
    from server_harness import wait_idle

    wait_idle(server.url, 0, 30)
    assert count() == before + 1


def test_short_soak_against_its_own_server(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "soak", "--model", str(smollm2_path),
         "--duration", "25s", "--clients", "4", "--max-num-seqs", "4", "--max-queue", "2",
         "--ctx", "512", "--burst-every", "7", "--disconnect-rate", "0.3",
         "--hostile-rate", "0.15", "--warmup", "5", "--threads", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: a check failed
    doc = json.loads(out.read_text())
    f = doc["figures"]
    print(proc.stdout)
    assert f["requests"] >= 20 and f["by_outcome"]["ok"] >= 5
    assert f["by_outcome"].get("disconnected", 0) >= 2
    assert f["http_5xx"] == 0 and f["server_5xx_in_metrics"] == 0 and f["stream_errors"] == 0
    assert f["hostile_not_4xx"] == 0 and f["valid_requests_given_4xx"] == 0
    assert f["dropped"] == 0
    assert f["kv_blocks_idle_after"] == f["kv_blocks_baseline"]
    assert f["kv_blocks_peak"] > f["kv_blocks_baseline"]
    assert f["aborts_freed"] >= 1 and f["abort_to_free_p99_s"] is not None
    # bursts of 12 on 4 running + 2 queued: some are shed, each with Retry-After
    assert f["rejections"] >= 1 and f["rejections_with_retry_after"] == f["rejections"]
    assert 0 < f["ttft_p50_s"] <= f["ttft_p99_s"] < 60
    assert f["rss"]["known"] and f["rss"]["end_mb"] > 50
    assert len(doc["samples"]) >= 15 and "verdict:" in proc.stdout
    names = {c["name"]: c["passed"] for c in doc["checks"]}
    assert names["no 5xx"] and names["KV back to baseline when idle"]


def test_overload_then_a_failing_engine(smollm2_path: Path) -> None:
    """One real server (2 running slots, no queue): a short overload run sheds with 429 +
    Retry-After and compares TTFT with its unloaded baseline, its clients honouring the
    Retry-After (a hammering run's come back sooner); then its engine raises on every 15th
    step and the soak's verdict says FAIL."""
    pytest.importorskip("uvicorn")
    from server_harness import ServerThread

    from localinfer.bench.soak.run import SoakPlan, run
    from localinfer.server.config import ServerConfig

    config = ServerConfig(model=str(smollm2_path), max_model_len=512, max_num_seqs=2,
                          max_queue=0, threads=2)
    srv = ServerThread(config, smollm2_path).start()
    steps = {"n": 0}
    lock = threading.Lock()

    def fault() -> None:
        with lock:
            steps["n"] += 1
            if steps["n"] % 15 == 0:
                raise RuntimeError("injected fault")

    try:
        over = run(SoakPlan(srv.url, duration_s=6, capacity=2, warmup_s=0, baseline_requests=4,
                            seed=5), overload=True)
        hammer = run(SoakPlan(srv.url, duration_s=4, capacity=2, warmup_s=0,
                              baseline_requests=1, ignore_retry_after=True, seed=6),
                     overload=True)
        srv.state.loop.step_hook = fault
        failing = run(SoakPlan(srv.url, clients=3, duration_s=8, capacity=2, burst_every_s=0,
                               warmup_s=0, hostile_rate=0.0, disconnect_rate=0.0, seed=3))
    finally:
        srv.stop()
    f = over.analysis.figures
    assert f["rejections"] >= 1 and f["rejections_with_retry_after"] == f["rejections"]
    assert f["by_outcome"]["ok"] >= 2 and f["http_5xx"] == 0 and f["dropped"] == 0
    assert f["baseline_ttft_p99_s"] > 0 and f["ttft_p99_ratio"] > 0
    assert sum(o.phase == "baseline" for o in over.outcomes) == 4
    # 6 clients honouring Retry-After: 1 (+-25%) send at most one request per 0.75 s each;
    # hammering, they come back after 50-250 ms
    assert f["rejections"] <= 6 * (6 / 0.75 + 1)
    assert hammer.analysis.figures["rejections"] > 6 * (4 / 0.75 + 1)
    assert not failing.analysis.passed
    f = failing.analysis.figures
    assert f["stream_errors"] + f["http_5xx"] >= 1
    assert not (_check(failing.analysis, "no error events") and _check(failing.analysis,
                                                                       "no 5xx"))


def test_sse_events_and_a_cut_stream() -> None:
    """One SSE reader for `bench serve` and the soak: JSON events until [DONE]; a stream cut
    before it, or an event that is not JSON, is the soak's stream_error (not a crash of the
    load generator); an error event is yielded for the caller to judge."""
    import asyncio

    from localinfer.bench.soak.workload import RequestSpec
    from localinfer.server.loadgen import StreamError, sse_events

    done = b'data: {"choices": [{"text": "a"}]}\n\n: keep-alive\n\ndata: {"error": "x"}\n\n' \
           b"data: [DONE]\n\n"
    bodies = {"/done": done, "/cut": b'data: {"choices": [{"text": "a"}]}\n\n',
              "/garbled": b"data: {not json\n\n"}
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, content=bodies[request.url.path], headers={"content-type": "text/event-stream"}))

    async def events(path: str) -> list[dict]:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c, \
                c.stream("POST", path) as r:
            return [e async for e in sse_events(r)]

    async def soak(path: str) -> Outcome:
        spec = RequestSpec("normal", path, True, b"{}")
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await send(c, spec, "soak", 0.0)

    assert asyncio.run(events("/done")) == [{"choices": [{"text": "a"}]}, {"error": "x"}]
    with pytest.raises(StreamError):
        asyncio.run(events("/cut"))
    cut, garbled = asyncio.run(soak("/cut")), asyncio.run(soak("/garbled"))
    assert cut.outcome == "stream_error" and "without [DONE]" in cut.error
    assert cut.ttft_s is not None  # its text before the cut was timed
    assert garbled.outcome == "stream_error" and "JSONDecodeError" in garbled.error
