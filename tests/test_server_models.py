"""Several models in one server (issue 18): routing by `model`, the memory plan (LRU eviction
of idle models, 503 naming the numbers), keep_alive and the idle expiry, `localinfer ps` and
`stop`, concurrent requests to two models; the real openai client against a real server."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
from gguf_factory import write_tiny_llama  # noqa: E402
from server_harness import ServerThread  # noqa: E402

from localinfer.server.config import ServerConfig  # noqa: E402
from localinfer.server.models.memory_plan import MB, estimate  # noqa: E402

CTX = 256
PROMPT = "The capital of France is"
WAIT_S = 120  # a generous bound for the server to act; not a timing assertion


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


def config(*models: Path, **kwargs) -> ServerConfig:
    return ServerConfig(models=[str(m) for m in models], model=str(models[0]),
                        max_model_len=CTX, max_num_seqs=4, threads=2, **kwargs)


def start(cfg: ServerConfig) -> ServerThread:
    return ServerThread(cfg, Path(cfg.models[0])).start()


def client_for(srv: ServerThread):
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)


def complete(client, model: str, **extra) -> str:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text


def loaded(srv: ServerThread) -> list[str]:
    return [m["name"] for m in httpx.get(f"{srv.url}/api/ps", timeout=30).json()["models"]]


def wait_for(predicate, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < end, f"not {what} within {WAIT_S} s"
        time.sleep(0.1)


def reference(path: Path) -> str:
    from localinfer import LLM, SamplingParams

    with LLM(path, max_model_len=CTX, threads=2, progress=False) as llm:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        return llm.generate(PROMPT, params)[0].text


@pytest.fixture(scope="module")
def two(smollm2_path, tiny_path):
    srv = start(config(smollm2_path, tiny_path))
    yield srv
    srv.stop()


def test_two_models_alternate_each_answers_as_itself(two, smollm2_path, tiny_path) -> None:
    client = client_for(two)
    smol, tiny = smollm2_path.stem, tiny_path.stem
    expected = {smol: reference(smollm2_path), tiny: reference(tiny_path)}
    assert expected[smol] != expected[tiny]
    for model in (smol, tiny, smol, tiny):
        assert complete(client, model) == expected[model], model
    assert complete(client, f"{tiny}:latest") == expected[tiny]  # an Ollama-style tag
    cards = {m.id: m for m in client.models.list()}
    assert set(cards) == {smol, tiny}
    assert all(c.model_extra["loaded"] and c.model_extra["memory_bytes"] > 0
               for c in cards.values())
    with pytest.raises(openai.NotFoundError, match=f"{smol}.*{tiny}"):
        complete(client, "nope")


def test_requests_to_two_models_at_once_all_complete(two, smollm2_path, tiny_path) -> None:
    client = client_for(two)
    models = [smollm2_path.stem, tiny_path.stem] * 3
    results: dict[int, str] = {}

    def ask(i: int, model: str) -> None:
        results[i] = complete(client, model)

    threads = [threading.Thread(target=ask, args=(i, m)) for i, m in enumerate(models)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == len(models)
    for i, model in enumerate(models):
        assert results[i] == results[i % 2], model  # same model, same greedy answer


def test_keep_alive_zero_unloads_after_the_request_and_metrics_label(two, tiny_path) -> None:
    client = client_for(two)
    tiny = tiny_path.stem
    complete(client, tiny)
    assert f"{tiny}:latest" in loaded(two)
    text = httpx.get(f"{two.url}/metrics").text
    assert f'localinfer_kv_blocks_total{{model="{tiny}"}}' in text
    complete(client, tiny, keep_alive=0)
    wait_for(lambda: f"{tiny}:latest" not in loaded(two), "unloaded")
    complete(client, tiny)  # loads again on demand
    assert f"{tiny}:latest" in loaded(two)


def test_idle_timeout_unloads_seen_in_localinfer_ps(two, tiny_path, capsys) -> None:
    from localinfer import cli

    client = client_for(two)
    tiny = tiny_path.stem
    complete(client, tiny, keep_alive="3s")
    assert cli.main(["ps", "--url", two.url]) == 0
    out = capsys.readouterr().out
    assert f"{tiny}:latest" in out and "MEMORY" in out
    wait_for(lambda: f"{tiny}:latest" not in loaded(two), "expired")
    assert cli.main(["ps", "--url", two.url]) == 0
    assert f"{tiny}:latest" not in capsys.readouterr().out


def test_localinfer_stop_unloads_one_model(two, smollm2_path, tiny_path, capsys) -> None:
    from localinfer import cli

    client = client_for(two)
    complete(client, tiny_path.stem)
    assert cli.main(["stop", tiny_path.stem, "--url", two.url]) == 0
    assert "unloaded" in capsys.readouterr().out
    assert loaded(two) == [f"{smollm2_path.stem}:latest"]
    assert cli.main(["stop", tiny_path.stem, "--url", two.url]) == 0
    assert "not loaded" in capsys.readouterr().out


def test_a_budget_for_one_model_unloads_the_idle_one(smollm2_path, tiny_path) -> None:
    base = config(smollm2_path, tiny_path)
    smol_need, tiny_need = (estimate(p, base).total for p in (smollm2_path, tiny_path))
    budget = max(smol_need, tiny_need) + min(smol_need, tiny_need) // 2
    assert budget < smol_need + tiny_need
    srv = start(config(smollm2_path, tiny_path, max_memory=budget))
    try:
        client = client_for(srv)
        smol, tiny = smollm2_path.stem, tiny_path.stem
        assert loaded(srv) == [f"{smol}:latest"]
        complete(client, tiny)
        assert loaded(srv) == [f"{tiny}:latest"]
        complete(client, smol)
        assert loaded(srv) == [f"{smol}:latest"]
    finally:
        srv.stop()


def test_a_model_larger_than_the_budget_gets_503_with_the_numbers(smollm2_path,
                                                                   tiny_path) -> None:
    base = config(tiny_path, smollm2_path)
    smol_need, tiny_need = (estimate(p, base).total for p in (smollm2_path, tiny_path))
    budget = (smol_need + tiny_need) // 2
    assert tiny_need < budget < smol_need
    srv = start(config(tiny_path, smollm2_path, max_memory=budget))
    try:
        r = httpx.post(f"{srv.url}/v1/completions", timeout=60,
                       json={"model": smollm2_path.stem, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert f"needs {smol_need / MB:.0f} MB" in message
        assert f"budget is {budget / MB:.0f} MB" in message and "MB are in use" in message
        assert loaded(srv) == [f"{tiny_path.stem}:latest"]  # nothing was unloaded for it
        assert complete(client_for(srv), tiny_path.stem)  # and the server keeps serving
    finally:
        srv.stop()


def test_keep_alive_and_memory_sizes_parse_as_documented() -> None:
    from localinfer.errors import InvalidRequestError
    from localinfer.server.models.keep_alive import parse_keep_alive
    from localinfer.server.models.memory_plan import parse_memory

    assert [parse_keep_alive(v) for v in (300, "5m", "30s", "1h30m", "0", 0, "2.5")] == [
        300.0, 300.0, 30.0, 5400.0, 0.0, 0.0, 2.5]
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None
    assert parse_memory("512") == 512 * MB and parse_memory("8G") == 8 << 30
    assert parse_memory("1.5GiB") == 3 << 29
    for bad in ("soon", "", True, [1], "5 parsecs"):
        with pytest.raises(InvalidRequestError):
            parse_keep_alive(bad)
    for bad in ("lots", "-5", "0", "8X"):
        with pytest.raises(InvalidRequestError):
            parse_memory(bad)


def test_a_model_that_fails_to_load_answers_clearly_and_the_rest_serve(tiny_path,
                                                                       tmp_path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    srv = start(config(tiny_path, broken))
    try:
        for _ in range(2):  # the failure is remembered, not retried on every request
            r = httpx.post(f"{srv.url}/v1/completions", timeout=60,
                           json={"model": "broken", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 500, r.text
            assert "'broken' failed to load" in r.json()["error"]["message"]
        assert complete(client_for(srv), tiny_path.stem)
        assert loaded(srv) == [f"{tiny_path.stem}:latest"]
    finally:
        srv.stop()


def test_responses_infill_and_bare_routes_serve_the_named_model(two, smollm2_path,
                                                                 tiny_path) -> None:
    bare = openai.OpenAI(base_url=two.url, api_key="none", max_retries=0)  # no /v1
    answers = {}
    for path in (smollm2_path, tiny_path):
        model = path.stem
        chat = bare.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
            temperature=0)
        resp = client_for(two).responses.create(model=model, input=PROMPT,
                                                max_output_tokens=8, temperature=0)
        assert resp.model == model and resp.output_text == chat.choices[0].message.content
        answers[model] = resp.output_text
    assert answers[smollm2_path.stem] != answers[tiny_path.stem]
    # /infill reaches the named model: the tiny one has no fill-in-the-middle tokens
    r = httpx.post(f"{two.url}/infill", json={"model": tiny_path.stem, "input_prefix": "def f(",
                                              "input_suffix": ")"}, timeout=60)
    assert r.status_code == 400 and tiny_path.stem in r.json()["error"]["message"]
