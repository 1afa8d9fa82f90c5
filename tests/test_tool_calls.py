"""Tool calls without a server: the streaming parser, OpenAI tool fields, tool turns for
templates with and without tool support, and the Hermes grammars on real vocabularies."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from localinfer.chat_template import ChatTemplate, validate_messages
from localinfer.errors import InvalidRequestError
from localinfer.gguf_file import open_gguf
from localinfer.structured import StructuredOutput
from localinfer.structured.guide import GuideFactory
from localinfer.tokenizer import Tokenizer
from localinfer.tools.hermes import call_grammar
from localinfer.tools.messages import for_template
from localinfer.tools.parser import ToolCallParser
from localinfer.tools.spec import ToolRequestError, parse_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

OUTPUTS = [
    # (model output, content, [(name, arguments)])
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [("get_weather", '{"city": "Paris"}')]),
    ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"s": "x}y\\"z", "n": [1, {"b": 2}]}}'
     '\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
     "Let me look.", [("a", '{"s": "x}y\\"z", "n": [1, {"b": 2}]}'), ("b", "{}")]),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "",
     [("get_weather", '{"city": "Oslo"}')]),  # a bare call object, no tags
    ("Plain text, a < b, and <tools> are not calls.", "Plain text, a < b, and <tools> are not "
     "calls.", []),
    ('{"a": 1}', '{"a": 1}', []),  # an object that is no call stays text
    ('Sure <tool_call>\n{"name": "f", "arguments": {"x": 1', "Sure <tool_call>\n{\"name\": "
     "\"f\", \"arguments\": {\"x\": 1", []),  # cut by max_tokens: back to text
    ('<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>',
     '<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>', []),  # not our shape
]


@pytest.mark.parametrize(("text", "content", "calls"), OUTPUTS)
def test_parser_whole_and_streamed_agree(text: str, content: str, calls: list) -> None:
    whole = ToolCallParser()
    whole.feed(text)
    whole.finish()
    assert whole.content == content
    assert [(c.name, c.arguments) for c in whole.complete_calls] == calls
    rng = random.Random(len(text))
    for _ in range(20):  # random chunkings, down to one character
        p = ToolCallParser()
        events = []
        i = 0
        while i < len(text):
            n = rng.randint(1, 6)
            events += p.feed(text[i:i + n])
            i += n
        events += p.finish()
        assert "".join(e[1] for e in events if e[0] == "content") == content
        args: dict[int, str] = {}
        names: dict[int, str] = {}
        for e in events:
            if e[0] == "call":
                assert e[1] not in names, "a call announced twice"
                names[e[1]] = e[2]
            elif e[0] == "arguments":
                args[e[1]] = args.get(e[1], "") + e[2]
        complete = [(names[k], args[k]) for k in sorted(names)
                    if p.calls[k].complete]
        assert complete == calls
        assert all(json.loads(a) is not None for _, a in complete)


def test_tool_fields_are_checked() -> None:
    assert parse_tools({}) is None
    cfg = parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                           "function": {"name": "get_weather"}}})
    assert cfg is not None and cfg.choice == "function" and cfg.forced == "get_weather"
    bad = [
        ({"tools": "x"}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]
    for body, param in bad:
        with pytest.raises(ToolRequestError) as info:
            parse_tools(body)
        assert info.value.param == param, body


def test_tool_turns_for_a_template_without_tool_support(smollm2_path: Path) -> None:
    gguf = open_gguf(smollm2_path)
    template = ChatTemplate.from_gguf(gguf.metadata)
    assert not template.renders_tools
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = validate_messages([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"}])
    msgs, extra = for_template(history, parse_tools({"tools": [WEATHER]}), False)
    assert extra == {} and msgs[0]["role"] == "system"
    assert '"name": "get_weather"' in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content":
                       '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                       "</tool_call>"}
    assert msgs[3]["role"] == "user" and "<tool_response>\n18 C, sunny" in msgs[3]["content"]
    assert "<tool_response>" in template.render(msgs)
    with pytest.raises(InvalidRequestError, match="c2"):
        for_template(validate_messages([
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "c2", "content": "y"}]), None, False)


@pytest.mark.parametrize("model", ["smollm2", "qwen2"])
def test_auto_grammar_frees_text_and_forces_calls(model: str, request) -> None:
    """Text tags (SmolLM2: a lazy lexeme ends the text at "<tool_call>") and the special token
    (Qwen): free text is accepted; once the call opens, only the call schema is."""
    path = request.getfixturevalue(f"{model}_path")
    tok = Tokenizer.from_gguf(open_gguf(path).metadata)
    special = "<tool_call>" in tok.vocab.token_to_id
    assert special == (model == "qwen2")
    cfg = parse_tools({"tools": [WEATHER]})
    assert cfg is not None
    factory = GuideFactory(tok)
    proto = factory.prepare(StructuredOutput(grammar=call_grammar(cfg, special_tags=special)))

    def accepts(text: str) -> bool:
        m = proto.deep_copy()
        return bool(m.consume_tokens(tok.encode(text, add_special=False,
                                                parse_special=False))) and not m.is_error()

    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts("Just some text, no call at all.")
    assert accepts(good) and accepts("Checking. " + good)
    assert accepts('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert not accepts('<tool_call>\n{"name": "other", "arguments": {}}')
    assert not accepts('<tool_call>\nnot json')
    assert not accepts('{"name": "get_weather", "arguments": {"town": 1}}')
