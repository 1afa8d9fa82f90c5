"""`localinfer serve --ray` on one machine: Ray with 2 CPUs, two SmolLM2 engine replicas of
one thread each behind the ingress, driven over loopback HTTP with the real openai client."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from server_harness import free_port, metrics, wait_healthy

openai = pytest.importorskip("openai")
ray = pytest.importorskip("ray")

from ray import serve  # noqa: E402

from localinfer.cluster.ingress import APP_NAME, ENGINE_DEPLOYMENT  # noqa: E402
from localinfer.cluster.launch import ClusterOptions, start  # noqa: E402
from localinfer.server.config import ServerConfig  # noqa: E402

MODEL = "smollm2-test"
HEADER = "x-localinfer-replica"
# long enough for several full 16-token blocks, so the cache hits are plain to see
SYSTEM = ("You are a patient geography tutor. Answer in one short sentence, name the "
          "continent first, and never invent facts about rivers, mountains or capitals.")


@pytest.fixture(scope="module")
def cluster(smollm2_path: Path):
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    port = free_port()
    config = ServerConfig(model=str(smollm2_path), models=[str(smollm2_path)],
                          served_model_name=MODEL, max_model_len=512, max_num_seqs=4,
                          port=port, log_level="warning")
    try:
        start(config, str(smollm2_path), ClusterOptions(replicas=2, threads_per_replica=1))
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        wait_replicas(url, 2)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def wait_replicas(url: str, n: int, timeout: float = 120) -> None:
    """Until /health reports exactly `n` engine replicas running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/health", timeout=30)
        if r.status_code == 200 and r.json()["replicas"] == {"RUNNING": n}:
            return
        time.sleep(0.5)
    raise AssertionError(f"not {n} replicas running: {r.text}")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(url: str, system: str, user: str, max_tokens: int = 4):
    raw = client(url).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
    return raw.headers[HEADER], raw.parse()


def replica_pids() -> dict[str, int]:
    """Each running engine replica's process id, asked through Serve's own handle."""
    handle = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=APP_NAME)
    pids: dict[str, int] = {}
    deadline = time.monotonic() + 60  # the handle learns of a new replica within seconds
    while len(pids) < 2 and time.monotonic() < deadline:
        info = handle.info.remote().result(timeout_s=60)
        pids[info.replica] = info.pid
        if len(pids) < 2:
            time.sleep(0.05)
    return pids


def test_health_and_metrics_cover_the_replicas(cluster: str) -> None:
    r = httpx.get(f"{cluster}/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok", "replicas": {"RUNNING": 2}}
    for i in range(6):  # different prefixes: both replicas serve and report
        chat(cluster, f"Persona {i}: {SYSTEM}", "Hi")
    assert metric_replicas(cluster) == set(replica_pids())


def metric_replicas(url: str) -> set[str]:
    """The replicas the ingress's /metrics has figures of."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("localinfer_prompt_tokens_total{")}


def test_shared_system_prompt_lands_on_one_replica_with_cache_hits(cluster: str) -> None:
    system = f"Shared. {SYSTEM}"
    served = []
    for i, city in enumerate(["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi"]):
        replica, answer = chat(cluster, system, f"Where is {city}?")
        served.append(replica)
        cached = answer.usage.prompt_tokens_details.cached_tokens
        if i:  # every later request reuses the system prompt's blocks on that replica
            assert cached >= 32, answer.usage
    assert len(set(served)) == 1, served
    m = metrics(cluster)
    assert m[f'localinfer_prefix_cache_hit_tokens_total{{model="{MODEL}",'
             f'replica="{served[0]}"}}'] >= 5 * 32


def test_a_chats_next_turn_reuses_its_history_on_the_same_replica(cluster: str) -> None:
    messages = [{"role": "system", "content": f"Turns. {SYSTEM}"},
                {"role": "user", "content": "Name three rivers in Africa."}]
    first = client(cluster).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=24, temperature=0, messages=messages)
    answer = first.parse()
    messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                 {"role": "user", "content": "And in Asia?"}]
    second = client(cluster).chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, temperature=0, messages=messages)
    assert second.headers[HEADER] == first.headers[HEADER]
    history = answer.usage.prompt_tokens + answer.usage.completion_tokens
    cached = second.parse().usage.prompt_tokens_details.cached_tokens
    assert cached >= (history // 16 - 1) * 16, (cached, history)  # all but a partial block


def test_different_prefixes_spread_over_both_replicas(cluster: str) -> None:
    served = Counter([chat(cluster, f"{name} says: {SYSTEM}", "Hello")[0]
                         for name in ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal",
                                      "Ivy", "Jo", "Kim", "Lu")])
    assert len(served) == 2 and min(served.values()) >= 2, served


def test_streams_and_the_ollama_api_come_through_the_ingress(cluster: str) -> None:
    with client(cluster).chat.completions.with_streaming_response.create(
            model=MODEL, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Count to five"}]) as raw:
        assert raw.headers[HEADER] in replica_pids()
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 6
    _, whole = chat(cluster, "", "Count to five", max_tokens=6)
    assert whole.usage.completion_tokens == 6
    ollama = httpx.post(f"{cluster}/api/chat", timeout=60, json={
        "model": MODEL, "stream": False, "options": {"num_predict": 3},
        "messages": [{"role": "user", "content": "Count to five"}]})
    assert ollama.status_code == 200 and ollama.json()["eval_count"] == 3
    assert ollama.headers[HEADER] in replica_pids()


BAD = [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": -1}),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": [
        {"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": "word " * 700}]}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "x", "schema": {"type": "nonsense"}}}}),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2, 10**9]]}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}),
]


def test_bad_input_gets_the_single_process_servers_errors(cluster: str, server) -> None:
    for path, body in BAD:
        ours = httpx.post(f"{cluster}{path}", json=body, timeout=60)
        theirs = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        assert 400 <= ours.status_code < 500, (path, body, ours.text)
        assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()), body
    r = httpx.post(f"{cluster}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"]
    assert chat(cluster, "", "Still there?")[1].choices[0].message.content


def test_a_replica_killed_mid_load_loses_no_request_that_had_not_started(cluster: str) -> None:
    """SIGKILL one replica while both hold streams and more wait in the router: every
    stream that had no token yet completes elsewhere; one that was cut ends with an error
    event; the service then runs on two replicas again."""
    pids = replica_pids()
    for i in range(6):  # both replicas serve and report figures before one dies
        chat(cluster, f"Before {i}: {SYSTEM}", "Hi")
    assert metric_replicas(cluster) == set(pids)
    results: dict[int, tuple[str | None, int, str | None]] = {}
    streaming: dict[int, tuple[str, int]] = {}  # streams under way: (replica, tokens so far)
    first_tokens = threading.Event()

    def stream(i: int) -> None:
        replica, tokens, error = None, 0, None
        try:
            with client(cluster).chat.completions.with_streaming_response.create(
                    model=MODEL, max_tokens=40, temperature=0, stream=True,
                    messages=[{"role": "system", "content": f"Voice {i}. {SYSTEM}"},
                              {"role": "user", "content": "Describe a long river."}]) as raw:
                replica = raw.headers[HEADER]
                for chunk in raw.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        tokens += 1
                        streaming[i] = (replica, tokens)
                        first_tokens.set()
        except openai.APIError as exc:
            error = str(exc)
        streaming.pop(i, None)
        results[i] = (replica, tokens, error)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(stream, i) for i in range(16)]
        assert first_tokens.wait(120)
        time.sleep(0.5)
        # the replica of the stream furthest from its end, so the kill finds it mid-way (the
        # first replica listed had sometimes finished its streams within the 0.5 s)
        under_way = sorted((n, r) for r, n in list(streaming.values()) if r in pids)
        victim = under_way[0][1] if under_way else next(iter(pids))
        os.kill(pids[victim], signal.SIGKILL)
        for f in futures:
            f.result(timeout=300)
    unstarted_losses = [r for r in results.values() if r[2] is not None and r[1] == 0]
    assert not unstarted_losses, results
    cut = [r for r in results.values() if r[2] is not None]
    assert cut, results  # the kill did catch streams mid-way
    assert all(r[0] == victim and r[1] > 0 and f"engine replica {victim} failed" in r[2]
               for r in cut), results
    finished = [r for r in results.values() if r[2] is None]
    assert len(finished) + len(cut) == 16 and all(r[1] > 0 for r in finished)
    # Serve replaces the dead replica; the service is whole again
    wait_replicas(cluster, 2)
    new = replica_pids()
    assert victim not in new and len(new) == 2
    for i in range(4):
        assert chat(cluster, f"After {i}. {SYSTEM}", "Hi")[1].choices[0].message.content
    # the dead replica's last figures no longer count in the ingress's /metrics
    assert victim not in metric_replicas(cluster)
