"""`localinfer serve` as a real subprocess: /health 503 while loading, then 200; SIGTERM drains
in-flight requests (RELIABILITY.md #28), refuses new ones with 503, and exits cleanly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("uvicorn")
from server_harness import free_port, wait_healthy  # noqa: E402


@pytest.fixture
def proc_server(smollm2_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "serve", "--model", str(smollm2_path),
         "--port", str(port), "--ctx", "512", "--drain-timeout", "300", "--threads", "2",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc, f"http://127.0.0.1:{port}"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_health_loading_then_ready_and_28_sigterm_drains(proc_server) -> None:
    proc, url = proc_server
    statuses = set()
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            r = httpx.get(f"{url}/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        statuses.add(r.status_code)
        if r.status_code == 503:
            assert r.json()["status"] == "loading" and "retry-after" in r.headers
            c = httpx.post(f"{url}/v1/completions", json={"prompt": "x"})
            if c.status_code == 200:
                # the model finished loading between the two requests: then health says so
                assert httpx.get(f"{url}/health").status_code == 200
            else:
                assert c.status_code == 503 and c.json()["error"]["type"]
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert statuses == {503, 200}, statuses  # the socket is up before the model is
    wait_healthy(url, proc=proc)

    # long enough to outlast SIGTERM (~0.8 s at 300 tok/s), short enough to drain on a busy box
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 240, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        while not next(lines).startswith("data:"):
            pass  # generation is under way
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        late = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                          timeout=10)
        assert late.status_code == 503 and "retry-after" in late.headers
        assert late.json()["error"]["message"]
        assert httpx.get(f"{url}/health").status_code == 503
        events = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finals[-1] == "length"  # the in-flight request ran to completion
    assert proc.wait(timeout=30) == 0
    assert "Traceback" not in proc.stdout.read()
