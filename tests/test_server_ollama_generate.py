"""POST /api/chat and /api/generate with the real `ollama` client against a real server:
streamed and not, greedy output equal to the OpenAI route's, options mapped, format (json, a
JSON Schema), tools, keep_alive 0, clear errors, and a closed stream freeing its KV blocks."""

from __future__ import annotations

import json

import httpx
import pytest

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
from server_harness import metrics as server_metrics  # noqa: E402
from server_harness import wait_idle  # noqa: E402

MODEL = "smollm2-test"
MESSAGES = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0, "num_predict": 12}
IDLE_BOUND_S = 30.0  # a generous bound for an abort to land; not a timing assertion
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def _openai_chat(oai, messages, max_tokens: int) -> str:
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                    temperature=0)
    return r.choices[0].message.content


def test_chat_streamed_and_not_equal_the_openai_route(client, oai) -> None:
    whole = client.chat(model=MODEL, messages=MESSAGES, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant"
    assert whole.message.content == _openai_chat(oai, MESSAGES, 12)
    assert whole.eval_count <= 12 and whole.prompt_eval_count > 5
    assert whole.total_duration >= whole.eval_duration >= 0 and whole.load_duration >= 0
    assert whole.created_at.endswith("Z") and whole.model == MODEL

    parts = list(client.chat(model=MODEL, messages=MESSAGES, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count


def test_generate_streamed_and_not(client, oai) -> None:
    whole = client.generate(model=MODEL, prompt="Name three colors.", options=GREEDY)
    assert whole.done and whole.response == _openai_chat(oai, MESSAGES, 12)  # the template
    parts = list(client.generate(model=MODEL, prompt="Name three colors.", options=GREEDY,
                                 stream=True))
    assert parts[-1].done and parts[-1].done_reason == whole.done_reason
    assert "".join(p.response for p in parts) == whole.response
    # raw: the prompt as written, as a completion of the text
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                          options=GREEDY)
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                               temperature=0)
    assert raw.response == r.choices[0].text
    # system: the chat template's system turn
    sys_answer = client.generate(model=MODEL, prompt="Name three colors.", system="Be terse.",
                                 options=GREEDY)
    assert sys_answer.response == _openai_chat(
        oai, [{"role": "system", "content": "Be terse."}, *MESSAGES], 12)


def test_options_num_predict_and_stop(client) -> None:
    r = client.generate(model=MODEL, prompt="Count from 1 to 50, separated by spaces.",
                        options={"temperature": 0, "num_predict": 5})
    assert r.eval_count == 5 and r.done_reason == "length"
    full = client.generate(model=MODEL, prompt="Count from 1 to 50, separated by spaces.",
                           options={"temperature": 0, "num_predict": 40})
    assert "5" in full.response
    cut = client.generate(model=MODEL, prompt="Count from 1 to 50, separated by spaces.",
                          options={"temperature": 0, "num_predict": 40, "stop": ["5"]})
    assert cut.response == full.response[:full.response.index("5")]
    assert cut.done_reason == "stop"
    # options Ollama has and we do not use are ignored, as Ollama does
    same = client.generate(model=MODEL, prompt="Count from 1 to 50, separated by spaces.",
                           options={"temperature": 0, "num_predict": 5, "num_gpu": 99,
                                    "mirostat": 0, "num_ctx": 512})
    assert same.response == r.response


def test_format_json_and_schema_give_valid_json(client) -> None:
    ask = "Give a cat's name and color as a JSON object with the keys name and color."
    r = client.chat(model=MODEL, format="json", options={"temperature": 0, "num_predict": 128},
                    messages=[{"role": "user", "content": ask}])
    assert r.done_reason == "stop", r.message.content  # the object ended, not the budget
    assert isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False}
    r = client.generate(model=MODEL, prompt="A person as JSON.", format=schema,
                        options={"temperature": 0, "num_predict": 64})
    person = json.loads(r.response)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


@pytest.fixture(scope="module")
def qwen_client(qwen2_path):
    """Qwen2.5-Coder 0.5B: its template renders tools and it calls them (SmolLM2 answers in
    text); Ollama's API has no tool_choice to force a call."""
    from server_harness import ServerThread

    from localinfer.server.config import ServerConfig

    cfg = ServerConfig(model=str(qwen2_path), served_model_name="qwen-test", max_model_len=1024,
                       max_num_seqs=2, threads=2)
    srv = ServerThread(cfg, qwen2_path).start()
    yield ollama.Client(host=srv.url, timeout=300)
    srv.stop()


def test_tools_give_tool_calls_with_object_arguments(qwen_client) -> None:
    client, model = qwen_client, "qwen-test"
    question = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = client.chat(model=model, messages=question, tools=[WEATHER],
                    options={"temperature": 0, "num_predict": 64})
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict) and "city" in call.function.arguments
    parts = list(client.chat(model=model, messages=question, tools=[WEATHER], stream=True,
                             options={"temperature": 0, "num_predict": 64}))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function for c in streamed] == [call.function]
    # the call and its result go back as history: Ollama's shape (no ids, tool_name)
    history = [*question, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "18 degrees, sunny", "tool_name": "get_weather"}]
    again = client.chat(model=model, messages=history, tools=[WEATHER],
                        options={"temperature": 0, "num_predict": 16})
    assert again.done


def test_load_and_keep_alive_zero_unloads_seen_in_ps(client) -> None:
    loaded = client.generate(model=MODEL, prompt="")
    assert loaded.done and loaded.done_reason == "load"
    assert MODEL in [m.model.split(":")[0] for m in client.ps().models]
    gone = client.generate(model=MODEL, prompt="", keep_alive=0)
    assert gone.done_reason == "unload"
    assert MODEL not in [m.model.split(":")[0] for m in client.ps().models]
    r = client.chat(model=MODEL, messages=MESSAGES, options=GREEDY)  # loads again on demand
    assert r.done and MODEL in [m.model.split(":")[0] for m in client.ps().models]


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.chat(model="nope", messages=MESSAGES), "nope"),
    (lambda c: c.chat(model=MODEL, messages=MESSAGES, options={"num_ctx": 100000}),
     "num_ctx 100000"),
    (lambda c: c.chat(model=MODEL, messages=MESSAGES, options={"temperature": "hot"}),
     "'temperature' must be a number"),
    (lambda c: c.chat(model=MODEL, messages=[{"role": "user", "content": "hi",
                                              "images": [b"\x89PNG"]}]), "text only"),
    (lambda c: c.generate(model=MODEL, prompt="hi", template="{{ .Prompt }}"), "template"),
    (lambda c: c.generate(model=MODEL, prompt="hi", format={"type": "bogus"}), "format"),
    (lambda c: c.chat(model=MODEL, messages=[{"role": "tool", "content": "18"}]),
     "answers no earlier assistant tool call"),
])
def test_bad_requests_raise_response_error_with_the_message(client, call, message) -> None:
    with pytest.raises(ollama.ResponseError, match=message) as e:
        call(client)
    assert 400 <= e.value.status_code < 500
    assert client.chat(model=MODEL, messages=MESSAGES, options=GREEDY).done  # still serving


def test_bad_fields_the_client_lets_through_are_clear_errors(server) -> None:
    for body, message in [
        ({"prompt": "hi", "format": "yaml"}, "'format' must be"),
        ({"prompt": "hi", "options": {"num_predict": 0}}, "num_predict"),
        ({"prompt": "hi", "options": "hot"}, "'options' must be an object"),
        ({"prompt": "hi", "think": True}, "does not support thinking"),
        ({"prompt": "hi", "context": [1, 2, 3]}, "'context' is not supported"),
        ({"prompt": "hi", "keep_alive": "soon"}, "invalid keep_alive"),
        ({"prompt": "hi", "stream": "yes"}, "'stream' must be a boolean"),
    ]:
        r = httpx.post(f"{server.url}/api/generate", json={"model": MODEL, **body}, timeout=60)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)


def test_closing_a_stream_frees_its_kv_blocks(server, client) -> None:
    client.generate(model=MODEL, prompt="hi", options={"num_predict": 1})  # loaded
    wait_idle(server.url, server_metrics(server.url)["localinfer_kv_blocks_used"], 60)
    baseline = server_metrics(server.url)["localinfer_kv_blocks_used"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
            "options": {"temperature": 0, "num_predict": 400}}
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, timeout=120) as r:
        lines = r.iter_lines()  # keep the iterator: closing it closes the response
        for _ in range(3):
            assert not json.loads(next(lines))["done"]
        m = server_metrics(server.url)
        assert m["localinfer_num_requests_running"] == 1
        assert m["localinfer_kv_blocks_used"] > baseline
    wait_idle(server.url, baseline, IDLE_BOUND_S)
