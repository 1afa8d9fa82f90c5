"""`serve --ray` flag checks (before Ray starts) and `bench serve --chats`, the multi-turn load
the cluster's benchmark runs, against the single-process server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localinfer import cli


def serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localinfer", "serve", *flags],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--replicas", "2"], "--replicas needs --ray"),
    (["--ray-address", "auto"], "--ray-address needs --ray"),
    (["--ray", "--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--ray", "--replicas", "0"], "--replicas: must be >= 1"),
    (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "larger than --max-replicas"),
    (["--ray", "--threads-per-replica", "0"], "--threads-per-replica: must be >= 1"),
    (["--ray", "-m", "a", "-m", "b"], "one model"),
    (["--ray", "--router", "random"], "invalid choice"),
    (["--router-threshold", "2"], "--router-threshold needs --ray"),
    (["--ray", "--router-threshold", "-1"], "--router-threshold is a number >= 0"),
    (["--ray", "--router", "round-robin", "--router-threshold", "2"], "for --router prefix"),
])
def test_bad_cluster_flags_are_refused_before_anything_starts(flags: list[str],
                                                              fragment: str) -> None:
    proc = serve(*flags)
    assert proc.returncode != 0
    assert fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_serve_chats_reports_later_turns_and_cache_hits(server, capsys, tmp_path) -> None:
    out = tmp_path / "chats.json"
    rc = cli.main(["bench", "serve", "--url", server.url, "--chats", "4", "--turns", "3",
                   "--system-prompts", "2", "--system-len", "64", "--user-len", "8",
                   "--max-tokens", "4", "--concurrency", "2", "--model", "smollm2-test",
                   "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "TTFT p99 later" in table and "prefix-cache hit rate" in table
    (run,) = json.loads(out.read_text())
    assert run["failed"] == 0 and run["chats"] == 4 and run["turns"] == 3
    assert run["later_ttft_p50_s"] > 0 and run["first_ttft_p50_s"] > 0
    # every later turn repeats its system prompt and history: most of it comes from the cache
    assert run["client_cached_share"] > 0.5 and 0.3 < run["hit_rate"] <= 1.0
    assert run["replicas"] == 0  # a single server names no replica


def test_bench_serve_chats_refuses_zero_turns(server, capsys) -> None:
    rc = cli.main(["bench", "serve", "--url", server.url, "--chats", "2", "--turns", "0"])
    assert rc != 0 and "--turns" in capsys.readouterr().err


def test_serve_ray_autoscales_and_runs_until_sigterm(smollm2_path) -> None:
    """The command itself: a one-machine Ray (token-protected) autoscaling 1..2 replicas of a
    one-sequence batch; the openai client through it; a queue of requests brings the second
    replica up; SIGTERM then stops Serve and Ray and the command exits 0."""
    pytest.importorskip("ray")
    import concurrent.futures
    import signal
    import time

    import httpx
    import openai
    from server_harness import free_port, wait_healthy

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "serve", "--ray", "--min-replicas", "1",
         "--max-replicas", "2", "--threads-per-replica", "1", "--max-num-seqs", "1",
         "-m", str(smollm2_path), "--ctx", "512", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout=300, proc=proc)
        assert httpx.get(f"{url}/health").json()["replicas"] == {"RUNNING": 1}
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

        def ask(i: int) -> str:
            raw = client.chat.completions.with_raw_response.create(
                model=smollm2_path.stem, max_tokens=40, temperature=0, extra_body={
                    "ignore_eos": True}, messages=[{"role": "user", "content": f"Hi {i}"}])
            assert raw.parse().usage.completion_tokens == 40
            return raw.headers["x-localinfer-replica"]

        served: set[str] = set()
        deadline = time.monotonic() + 90
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            while time.monotonic() < deadline and len(served) < 2:
                served |= set(pool.map(ask, range(6)))
        assert len(served) == 2, "the queue never brought a second replica up"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
