"""`localinfer serve --backend triton`: the real server over the Triton backend (interpreted on
the CPU without a GPU) on a tiny llama, driven by the real openai client — the shared engine's
streaming and structured output working over the third backend."""

from __future__ import annotations

import json

import openai
import pytest
from gguf_factory import write_tiny_llama
from server_harness import ServerThread

from localinfer.server.config import ServerConfig


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=1)
    config = ServerConfig(model=str(path), served_model_name="tiny", backend="triton",
                          max_model_len=256, max_num_seqs=4, kv_cache_mb=2)
    srv = ServerThread(config, path).start()
    yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)
    srv.stop()


def test_chat_stream_equals_whole(client):
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "hello world"}],
              "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    assert whole.system_fingerprint.endswith("-triton")
    assert whole.usage.completion_tokens == 6
    chunks = client.chat.completions.create(**kwargs, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_json_schema_output(client):
    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 6}},
              "required": ["w"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the and"}], max_tokens=40,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "w", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    assert set(json.loads(out.choices[0].message.content)) == {"w"}
