"""JSON Schemas of the server's request and response bodies, as its validators accept them.

Each request schema states the types and ranges protocol.py, ollama/options.py,
responses/input.py, fim.py and routes_info.py check (a value outside them is a 400 with the
field named). What only the loaded model decides (a context length, a vocabulary size, what a
chat template accepts) is not in the schema; it is a documented 400. Objects stay open
(`additionalProperties` allowed): unknown fields are ignored, as the OpenAI and Ollama servers
ignore them, unless a validator refuses them by name.
"""

from __future__ import annotations

from typing import Any

from localinfer.sampling_params import MAX_LOGPROBS
from localinfer.server.protocol import MAX_N, MAX_STOP

Schema = dict[str, Any]

INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}
STRING_OR_NULL = {"type": ["string", "null"]}


def number(lo: float, hi: float, *, exclusive_lo: bool = False) -> Schema:
    bound = {"exclusiveMinimum": lo} if exclusive_lo else {"minimum": lo}
    return {"type": "number", **bound, "maximum": hi}


def integer(lo: int, hi: int | None = None) -> Schema:
    schema: Schema = {"type": "integer", "minimum": lo}
    if hi is not None:
        schema["maximum"] = hi
    return schema


# a Go duration ("5m", "1h30m"), a number of seconds as a string, or a number
KEEP_ALIVE = {"oneOf": [{"type": "number"}, {"type": "string"}]}
STOP = {"oneOf": [{"type": "string", "minLength": 1},
                  {"type": "array", "items": {"type": "string", "minLength": 1},
                   "maxItems": MAX_STOP}]}
SAMPLING: Schema = {
    "model": {"type": "string"},
    "keep_alive": KEEP_ALIVE,
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "n": integer(1, MAX_N),
    "seed": INT64,
    "temperature": number(0.0, 2.0),
    "top_p": number(0.0, 1.0, exclusive_lo=True),
    "top_k": integer(-1, 1 << 20),
    "min_p": number(0.0, 1.0),
    "repetition_penalty": number(1e-3, 10.0),
    "presence_penalty": number(-2.0, 2.0),
    "frequency_penalty": number(-2.0, 2.0),
    "stop": STOP,
    "ignore_eos": {"type": "boolean"},
    "logit_bias": {"type": "object", "additionalProperties": number(-100.0, 100.0)},
    "response_format": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "json_schema": {"type": "object"}}},
    "structured_outputs": {"type": "object"},
    "guided_json": {"type": ["object", "string"]},
    "guided_regex": {"type": "string"},
    "guided_choice": {"type": "array", "items": {"type": "string"}},
    "guided_grammar": {"type": "string"},
}
TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "description": {"type": "string"},
        "parameters": {"type": "object"}}}}}
CONTENT_PART = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string"}, "text": {"type": "string"}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"oneOf": [{"type": "string"}, {"type": "null"},
                          {"type": "array", "items": CONTENT_PART}]},
    "name": {"type": "string"},
    "tool_call_id": {"type": "string"},
    "tool_calls": {"type": "array", "items": {"type": "object"}}}}
MESSAGES = {"type": "array", "items": MESSAGE, "minItems": 1}
TOKEN_IDS = {"type": "array", "items": {"type": "integer"}}
PROMPT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                    TOKEN_IDS, {"type": "array", "items": TOKEN_IDS}]}


def _body(properties: Schema, required: tuple[str, ...] = ()) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


CHAT_REQUEST = _body({
    **SAMPLING, "messages": MESSAGES,
    "max_tokens": integer(1), "max_completion_tokens": integer(1),
    "logprobs": {"type": "boolean"}, "top_logprobs": integer(0, MAX_LOGPROBS),
    "tools": {"type": "array", "items": TOOL},
    "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
    "parallel_tool_calls": {"type": "boolean"},
}, ("messages",))
COMPLETION_REQUEST = _body({
    **SAMPLING, "prompt": PROMPT, "suffix": {"type": "string"}, "echo": {"type": "boolean"},
    "max_tokens": integer(0), "logprobs": integer(0, MAX_LOGPROBS),
    "best_of": integer(1, MAX_N),
}, ("prompt",))
INFILL_REQUEST = _body({
    **{k: SAMPLING[k] for k in ("model", "keep_alive", "stream", "seed", "temperature", "top_p",
                                "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                "stop")},
    "input_prefix": {"type": "string"}, "input_suffix": {"type": "string"},
    "prompt": {"type": "string"},
    "input_extra": {"type": "array", "items": {"type": "object", "properties": {
        "filename": {"type": "string"}, "text": {"type": "string"}}}},
    "n_predict": integer(-1), "repeat_penalty": number(1e-3, 10.0),
})
RESPONSES_REQUEST = _body({
    **{k: SAMPLING[k] for k in ("model", "keep_alive", "stream", "temperature", "top_p")},
    "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "instructions": {"type": "string"},
    "max_output_tokens": integer(1),
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
    "text": {"type": "object", "properties": {"format": {"type": "object"}}},
    "store": {"type": "boolean"}, "metadata": {"type": "object"},
    "parallel_tool_calls": {"type": "boolean"},
}, ("input",))
TOKENIZE_REQUEST = _body({"model": {"type": "string"}, "prompt": {"type": "string"},
                          "messages": MESSAGES, "add_special_tokens": {"type": "boolean"}})
DETOKENIZE_REQUEST = _body({"model": {"type": "string"}, "tokens": TOKEN_IDS}, ("tokens",))

# -- Ollama ---------------------------------------------------------------------------------
OLLAMA_OPTIONS = {"type": "object", "properties": {
    "temperature": number(0.0, 2.0), "top_k": integer(-1, 1 << 20),
    "top_p": number(0.0, 1.0, exclusive_lo=True), "min_p": number(0.0, 1.0),
    "seed": INT64, "stop": STOP, "num_predict": integer(-2, 2**31),
    "repeat_penalty": number(1e-3, 10.0), "repeat_last_n": integer(-1, 1 << 20),
    "presence_penalty": number(-2.0, 2.0), "frequency_penalty": number(-2.0, 2.0),
    "num_ctx": integer(1)}}
OLLAMA_FORMAT = {"oneOf": [{"enum": ["", "json"]}, {"type": "object"}]}
OLLAMA_COMMON = {"model": {"type": "string", "minLength": 1}, "stream": {"type": "boolean"},
                 "keep_alive": KEEP_ALIVE, "options": OLLAMA_OPTIONS, "format": OLLAMA_FORMAT}
OLLAMA_CHAT_REQUEST = _body({
    **OLLAMA_COMMON, "tools": {"type": "array", "items": TOOL},
    "messages": {"type": "array", "items": MESSAGE},
    "think": {"type": "boolean"}}, ("model",))
OLLAMA_GENERATE_REQUEST = _body({
    **OLLAMA_COMMON, "prompt": {"type": "string"}, "suffix": {"type": "string"},
    "system": {"type": "string"}, "raw": {"type": "boolean"},
    "images": {"type": "array", "items": {"type": "string"}},
    "context": TOKEN_IDS}, ("model",))
OLLAMA_NAME_REQUEST = _body({"model": {"type": "string", "minLength": 1},
                             "name": {"type": "string", "minLength": 1},
                             "stream": {"type": "boolean"}})

# -- answers --------------------------------------------------------------------------------
OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "object", "required": ["message", "type", "param", "code"],
              "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                             "param": STRING_OR_NULL, "code": STRING_OR_NULL}}}}
OLLAMA_ERROR = {"type": "object", "required": ["error"],
                "properties": {"error": {"type": "string"}}}
CHOICES = {"type": "array", "items": {"type": "object", "required": ["index", "finish_reason"]}}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]}
COMPLETION = {"type": "object", "required": ["id", "object", "created", "model", "choices"],
              "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                             "created": {"type": "integer"}, "model": {"type": "string"},
                             "choices": CHOICES, "usage": USAGE}}
MODEL_LIST = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"const": "list"},
    "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"]}}}}
RESPONSE = {"type": "object", "required": ["id", "object", "status", "model", "output"],
            "properties": {"object": {"const": "response"}, "status": {"type": "string"},
                           "output": {"type": "array"}}}
INFILL = {"type": "object", "required": ["content", "stop", "tokens_predicted"],
          "properties": {"content": {"type": "string"}, "stop": {"type": "boolean"},
                         "tokens_predicted": {"type": "integer"}}}
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
HEALTH = {"type": "object", "required": ["status"],
          "properties": {"status": {"enum": ["ok", "loading", "draining", "error"]},
                         "error": {"type": "string"}}}
TOKENS = {"type": "object", "required": ["tokens", "count", "max_model_len"],
          "properties": {"tokens": TOKEN_IDS, "count": {"type": "integer"},
                         "max_model_len": {"type": "integer"}}}
DETOKENIZED = {"type": "object", "required": ["prompt"],
               "properties": {"prompt": {"type": "string"}}}
OLLAMA_MODELS = {"type": "object", "required": ["models"], "properties": {
    "models": {"type": "array", "items": {"type": "object", "required": ["name", "model"]}}}}
OLLAMA_VERSION = {"type": "object", "required": ["version"],
                  "properties": {"version": {"type": "string"}}}
OLLAMA_SHOW = {"type": "object", "required": ["modelfile", "details", "model_info"]}
OLLAMA_PULL = {"type": "object", "properties": {"status": {"type": "string"}}}
OLLAMA_ANSWER = {"type": "object", "required": ["model", "created_at", "done"],
                 "properties": {"model": {"type": "string"}, "done": {"type": "boolean"}}}
UNLOADED = {"type": "object", "required": ["model", "unloaded", "pending"],
            "properties": {"model": {"type": "string"}, "unloaded": {"type": "boolean"},
                           "pending": {"type": "boolean"}}}
