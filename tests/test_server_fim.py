"""Fill-in-the-middle on Qwen2.5-Coder-0.5B (a GGUF with FIM tokens): `suffix` on
/v1/completions through the openai client, and llama.cpp's /infill shape, streamed and not."""

from __future__ import annotations

import ast
import json

import httpx
import pytest

openai = pytest.importorskip("openai")

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def coder(qwen2_path):
    pytest.importorskip("uvicorn")
    from server_harness import ServerThread

    from localinfer.server.config import ServerConfig

    config = ServerConfig(model=str(qwen2_path), served_model_name="coder", max_model_len=512,
                          max_num_seqs=4, threads=2)
    srv = ServerThread(config, qwen2_path).start()
    yield srv
    srv.stop()


def fills_the_body(middle: str) -> bool:
    source = PREFIX + middle + SUFFIX
    ast.parse(source)  # a SyntaxError fails the test with the source in view
    namespace: dict[str, object] = {}
    exec(compile(source.replace("print(", "result = ("), "<fim>", "exec"), namespace)
    return namespace["result"] == 3


def test_suffix_fills_a_function_body(coder) -> None:
    client = openai.OpenAI(base_url=f"{coder.url}/v1", api_key="unused", max_retries=0,
                           timeout=300)
    # the 0.5B instruct model writes on past the middle (more calls, prose): an editor cuts
    # the fill at the end of the block, here with a stop string as plugins send
    r = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=24,
                                  temperature=0, stop=["\n\n"])
    middle = r.choices[0].text
    assert "return" in middle and fills_the_body(middle), middle
    assert r.choices[0].finish_reason == "stop"


def test_infill_route_streamed_and_not(coder) -> None:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 24,
            "temperature": 0, "stop": ["\n\n"], "input_extra": [{"filename": "util.py", "text": "import os\n"}]}
    r = httpx.post(f"{coder.url}/infill", json=body, timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["stop"] is True and answer["stop_type"] == "eos"
    assert answer["tokens_predicted"] > 0 and answer["tokens_evaluated"] > 10
    assert fills_the_body(answer["content"]), answer["content"]
    with httpx.stream("POST", f"{coder.url}/infill", json={**body, "stream": True},
                      timeout=300) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == answer["content"]
    bad = httpx.post(f"{coder.url}/infill", json={**body, "input_extra": "x"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra"
