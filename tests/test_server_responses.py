"""The Responses API through the real openai client (text, instructions, input items, the
event stream, function tools), and the OpenAI routes without the /v1 prefix."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")

QUESTION = "Name three colors."
ORDER = ["response.created", "response.in_progress", "response.output_item.added",
         "response.content_part.added", "response.output_text.delta",
         "response.output_text.done", "response.content_part.done",
         "response.output_item.done"]
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def chat_text(client, messages, max_tokens=12) -> str:
    r = client.chat.completions.create(model="smollm2-test", messages=messages,
                                       max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def test_create_answers_as_the_chat_route_does(client) -> None:
    r = client.responses.create(model="smollm2-test", input=QUESTION, max_output_tokens=12,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "smollm2-test"
    assert r.status in ("completed", "incomplete") and r.created_at > 0
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert r.output_text == chat_text(client, [{"role": "user", "content": QUESTION}])
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_instructions_are_the_system_message_and_items_equal_a_string(client) -> None:
    system = "You answer in French."
    r = client.responses.create(model="smollm2-test", instructions=system, input=QUESTION,
                                max_output_tokens=12, temperature=0)
    assert r.instructions == system
    assert r.output_text == chat_text(client, [{"role": "system", "content": system},
                                               {"role": "user", "content": QUESTION}])
    items = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    by_items = client.responses.create(model="smollm2-test", input=items, instructions=system,
                                       max_output_tokens=12, temperature=0)
    assert by_items.output_text == r.output_text


def test_stream_is_the_official_event_sequence(client) -> None:
    whole = client.responses.create(model="smollm2-test", input=QUESTION, max_output_tokens=12,
                                    temperature=0)
    events = list(client.responses.create(model="smollm2-test", input=QUESTION,
                                          max_output_tokens=12, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deduped = [k for i, k in enumerate(kinds[:-1]) if i == 0 or k != kinds[i - 1]]
    assert deduped == ORDER
    assert kinds[-1] == ("response.completed" if whole.status == "completed"
                         else "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text and events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_function_tools_give_function_call_items(client) -> None:
    kwargs = {"model": "smollm2-test", "input": "What is the weather in Paris?",
              "tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 60,
              "temperature": 0}
    r = client.responses.create(**kwargs)
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments).get("city"), str)
    events = list(client.responses.create(**kwargs, stream=True))
    args: dict[str, str] = {}  # item id -> its streamed argument fragments, joined
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            args[e.item_id] = args.get(e.item_id, "") + e.delta
    assert list(args.values()) == [c.arguments for c in calls]
    final = events[-1].response
    assert [(i.type, getattr(i, "arguments", None)) for i in final.output] == [
        (i.type, getattr(i, "arguments", None)) for i in r.output]
    # the call's output goes back as input items: the model answers in text
    follow = client.responses.create(
        model="smollm2-test", tools=[WEATHER], max_output_tokens=12, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny, 21 C"}])
    assert follow.output and follow.status in ("completed", "incomplete")


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_unserved_fields_are_a_400_naming_them(client, extra, param) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": "smollm2-test", "input": QUESTION, **extra})
    assert e.value.body["param"] == param


def test_routes_without_the_v1_prefix(server) -> None:
    models = httpx.get(f"{server.url}/models").json()
    assert models["data"][0]["id"] == "smollm2-test"
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    bare = httpx.post(f"{server.url}/completions", json=body, timeout=60).json()
    v1 = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert bare["choices"][0]["text"] == v1["choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    assert httpx.post(f"{server.url}/chat/completions", json=chat, timeout=60).status_code == 200
    r = httpx.post(f"{server.url}/responses", json={"input": "Hi", "max_output_tokens": 3},
                   timeout=60)
    assert r.json()["object"] == "response"


def test_text_format_json_schema_constrains_the_output(client) -> None:
    schema = {"type": "object", "properties": {"color": {"type": "string"}},
              "required": ["color"], "additionalProperties": False}
    r = client.responses.create(model="smollm2-test", input="Give me a color as JSON.",
                                max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "c",
                                                 "schema": schema}})
    assert isinstance(json.loads(r.output_text)["color"], str)
