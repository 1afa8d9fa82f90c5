"""Structured output and tool calls through the real openai client, on qwen2.5-coder-0.5b.

One server for the module (loading Qwen and compiling its kernels is the slow part); a second,
with a KV pool too small for the batch, checks that preemption keeps constrained outputs valid.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

MODEL = "qwen-test"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
                   "required": ["zone"]}}}
WEATHER_Q = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "role": {"enum": ["engineer", "designer", "manager"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 15},
                   "minItems": 1, "maxItems": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "nickname": {"type": "string", "maxLength": 12},
    },
    "required": ["name", "age", "email", "role", "address", "skills"],
    "additionalProperties": False,
}


def _server(path: Path, **config: Any):
    pytest.importorskip("uvicorn")
    from server_harness import ServerThread

    from localinfer.server.config import ServerConfig

    cfg = ServerConfig(model=str(path), served_model_name=MODEL, threads=2, **config)
    return ServerThread(cfg, path).start()


@pytest.fixture(scope="module")
def qwen_server(qwen2_path: Path):
    srv = _server(qwen2_path, max_model_len=2048, max_num_seqs=16)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(qwen_server):
    return openai.OpenAI(base_url=f"{qwen_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=300)


def _chat(client, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 96)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def test_parse_with_pydantic_model(client) -> None:
    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int

    r = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format=City, temperature=0, max_tokens=96)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("prompt", [
    "Invent an employee of a small company and describe them.",
    "Describe a fictional designer who lives in Lyon.",
    "Give me a profile of a manager named Ada.",
])
def test_json_schema_outputs_validate(client, prompt: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                  "strict": True}}
    r = _chat(client, [{"role": "user", "content": prompt}], response_format=fmt,
              max_tokens=160)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object(client) -> None:
    r = _chat(client, [{"role": "user", "content": "List two fruits as JSON."}],
              response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_and_choice(client) -> None:
    r = _chat(client, [{"role": "user", "content": "Give me a US phone number."}],
              extra_body={"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].message.content)
    options = ["positive", "negative", "neutral"]
    for text in ("I love this!", "This is awful."):
        r = _chat(client, [{"role": "user", "content": f"Sentiment of: {text}"}],
                  extra_body={"structured_outputs": {"choice": options}})
        assert r.choices[0].message.content in options
    r = client.completions.create(model=MODEL, prompt="The answer is", temperature=0,
                                  max_tokens=8, extra_body={"guided_regex": "[0-9]{2,4}"})
    assert re.fullmatch("[0-9]{2,4}", r.choices[0].text)


def _validate_call(call, tools=(WEATHER, TIME)) -> dict:
    schema = next(t["function"]["parameters"] for t in tools
                  if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    assert call.type == "function" and call.id.startswith("call_")
    return args


def test_tool_choice_required_and_named(client) -> None:
    r = _chat(client, WEATHER_Q, tools=[WEATHER, TIME], tool_choice="required",
              parallel_tool_calls=False)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert len(msg.tool_calls) == 1
    _validate_call(msg.tool_calls[0])
    named = {"type": "function", "function": {"name": "get_time"}}
    r = _chat(client, WEATHER_Q, tools=[WEATHER, TIME], tool_choice=named)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls] == ["get_time"]
    _validate_call(calls[0])


def test_tool_choice_auto_calls_only_when_needed(client) -> None:
    r = _chat(client, WEATHER_Q, tools=[WEATHER])
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    assert _validate_call(calls[0])["city"] == "Paris"
    r = _chat(client, [{"role": "user", "content": "Hi! How are you?"}], tools=[WEATHER])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_streamed_tool_call_equals_non_streamed(client) -> None:
    kw: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": "required",
                          "parallel_tool_calls": False}
    whole = _chat(client, WEATHER_Q, **kw).choices[0].message.tool_calls
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in _chat(client, WEATHER_Q, stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
            if d.id:
                assert entry["id"] is None, "id sent twice"
                entry["id"] = d.id
            if d.function and d.function.name:
                assert entry["name"] is None, "name sent twice"
                entry["name"] = d.function.name
            if d.function and d.function.arguments:
                entry["args"] += d.function.arguments
    assert finish == "tool_calls"
    streamed = [(calls[i]["name"], calls[i]["args"]) for i in sorted(calls)]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole]
    assert all(calls[i]["id"] for i in calls)


def test_follow_up_turn_with_tool_result(client, qwen_server) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    history = [*WEATHER_Q, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1",
                "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    # the template renders the call and the result where the model expects them
    llm = qwen_server.state.llm
    from localinfer.chat_template import validate_messages
    from localinfer.tools.messages import for_template
    from localinfer.tools.spec import parse_tools

    tools = parse_tools({"tools": [WEATHER]})
    msgs, extra = for_template(validate_messages(history), tools, True)
    text = llm.tokenizer.decode(llm.encode(msgs, **extra))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in text
    assert '<tool_response>\n{"temperature": 18, "sky": "sunny"}\n</tool_response>' in text
    listed = text.split("<tools>\n")[1].split("</tools>")[0]  # the system message's tools
    assert '"name": "get_weather"' in listed
    r = _chat(client, history, tools=[WEATHER], tool_choice="none", max_tokens=48)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    r = _chat(client, history, tools=[WEATHER], max_tokens=48)
    msg = r.choices[0].message
    assert msg.content or msg.tool_calls
    for c in msg.tool_calls or []:
        _validate_call(c)


def test_bad_constraints_are_400_naming_the_feature(client) -> None:
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
         "response_format", "uniqueItems"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"not": {"type": "string"}}}}}, "response_format", "not"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": "(?=a)b"}}}},
         "response_format", "look-around"),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs",
         "unclosed group"),
        ({"extra_body": {"structured_outputs": {"grammar": "start: nope"}}},
         "structured_outputs", "nope"),
        ({"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "x": {"type": "array", "uniqueItems": True}}}}}], "tool_choice": "required"},
         "tools", "uniqueItems"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                              "function": {"name": "nope"}}},
         "tool_choice", "nope"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format",
         "tools"),
    ]
    for kw, param, feature in cases:
        with pytest.raises(openai.BadRequestError) as info:
            _chat(client, [{"role": "user", "content": "hi"}], max_tokens=4, **kw)
        err = info.value.body
        assert err["param"] == param, (kw, err)
        assert feature in err["message"], (kw, err)
    orphan = [{"role": "user", "content": "hi"},
              {"role": "tool", "tool_call_id": "call_x", "content": "42"}]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, orphan, max_tokens=4)
    assert info.value.body["param"] == "messages" and "call_x" in info.value.body["message"]
    # the server is fine afterwards
    assert _chat(client, [{"role": "user", "content": "hi"}], max_tokens=2).choices


def _requests() -> list[dict[str, Any]]:
    q = [{"role": "user", "content": c} for c in (
        "Name a fruit.", "Describe a cat as JSON.", "Write a haiku.", "Pick a colour.",
        "Count to five.", "Give me a date.", "Say hello.")]
    return [
        {"messages": [q[0]]},
        {"messages": [q[1]], "response_format": {"type": "json_object"}, "max_tokens": 48},
        {"messages": [q[2]], "max_tokens": 32},
        {"messages": [q[3]], "extra_body": {"structured_outputs": {
            "choice": ["red", "green", "blue"]}}},
        {"messages": [q[4]], "max_tokens": 24},
        {"messages": [q[5]], "extra_body": {"structured_outputs": {
            "regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}}},
        {"messages": WEATHER_Q, "tools": [WEATHER], "tool_choice": "required",
         "parallel_tool_calls": False},
        {"messages": [q[6]], "max_tokens": 16},
    ]


def _answer(r) -> tuple[Any, ...]:
    m = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    return m.content, calls, r.choices[0].finish_reason


def test_concurrent_mixed_requests_equal_alone(client) -> None:
    reqs = _requests()
    alone = [_answer(_chat(client, **r)) for r in reqs]
    with ThreadPoolExecutor(len(reqs)) as pool:
        together = list(pool.map(lambda r: _answer(_chat(client, **r)), reqs))
    assert together == alone


def test_preemption_keeps_constrained_outputs_valid(qwen2_path: Path) -> None:
    # ~12 KB of KV per token: 3 MB holds ~250 tokens, far less than six requests need
    srv = _server(qwen2_path, max_model_len=512, max_num_seqs=8, kv_cache_mb=3.0)
    try:
        c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0,
                          timeout=300)
        schema = {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string", "maxLength": 12},
                      "minItems": 4, "maxItems": 6}}, "required": ["items"],
            "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "list", "schema": schema}}
        prompts = [f"List {k} things you find in a kitchen." for k in
                   ("four", "five", "six", "some", "several", "many")]
        def one(p: str) -> str:
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                          response_format=fmt, temperature=0, max_tokens=80)
            assert r.choices[0].finish_reason == "stop"
            return r.choices[0].message.content
        with ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(one, prompts))
        assert srv.state.llm.engine.scheduler.num_preemptions > 0
        for out in outs:
            jsonschema.validate(json.loads(out), schema)
        assert outs == [one(p) for p in prompts]  # the same as without preemption
    finally:
        srv.stop()
