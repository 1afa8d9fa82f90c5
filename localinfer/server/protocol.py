"""Request validation and OpenAI error bodies.

Every client mistake becomes an APIError with a 4xx status and an OpenAI-style body
`{"error": {"message", "type", "param", "code"}}` — never a 500 (the openai client retries 5xx
twice, tripling the load).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.sampling_params import MAX_LOGPROBS, SamplingParams

if TYPE_CHECKING:
    from localinfer.server.constraints import Constraints

MAX_N = 32
MAX_STOP = 16
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _ERROR_TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unavailable(message: str, retry_after: int = 1, status: int = 503) -> APIError:
    return APIError(status, message, headers={"Retry-After": str(retry_after)})


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(None, f"request body is not valid UTF-8: {exc.reason}") from exc
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise invalid(None, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise invalid(None, f"request body must be a JSON object, got {_kind(body)}")
    return body


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


# -- typed field readers ---------------------------------------------------------------------


def get_int(body: dict[str, Any], name: str, lo: int, hi: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"'{name}' must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {value}")
    return value


def get_float(body: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"'{name}' must be a number, got {_kind(value)}")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise invalid(name, f"'{name}' must be between {lo} and {hi}, got {value}")
    return float(value)


def get_bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"'{name}' must be a boolean, got {_kind(value)}")
    return value


def get_stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise invalid("stop", "'stop' must be a non-empty string or a list of them")
    if len(stop) > MAX_STOP:
        raise invalid("stop", f"'stop' may hold at most {MAX_STOP} strings")
    return stop


# -- the shared part of chat and completion requests ------------------------------------------


@dataclass(slots=True)
class GenerationFields:
    model: str | None
    n: int
    stream: bool
    include_usage: bool
    max_tokens: int | None  # None: until the context is full
    logprobs: int | None  # None: off; k: the sampled token's logprob and the top k
    params: SamplingParams  # max_tokens is set per prompt once its length is known
    constraints: Constraints  # response_format, structured_outputs, tools
    echo: bool = False  # completions: the answer starts with the prompt (and its logprobs)
    # completions with echo and max_tokens 0: the prompt scored, nothing generated (the engine
    # samples one token at the end of the prefill anyway; it is dropped)
    prompt_only: bool = False

    def bind_tools(self, tokenizer: Any) -> None:
        """Bind the request's tools to the model's tokenizer (its call format) and make the
        resulting constraint the sampling parameters' structured output."""
        self.constraints.bind_tools(tokenizer)
        self.params.structured = self.constraints.structured


def parse_generation(body: dict[str, Any], *, chat: bool, max_model_len: int,
                     n_vocab: int | None = None) -> GenerationFields:
    """n_vocab: the model's vocabulary size, which logit_bias ids are checked against."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "'model' must be a string")
    _reject_unsupported(body, chat)
    from localinfer.server.constraints import parse_constraints  # they import this module
    from localinfer.server.logit_bias import parse_logit_bias

    constraints = parse_constraints(body, chat=chat)
    echo = not chat and get_bool(body, "echo")
    # max_tokens 0 with echo: score the prompt only (lm-evaluation-harness's loglikelihood)
    max_tokens = get_int(body, "max_tokens", 0 if echo else 1, max_model_len, None)
    prompt_only = max_tokens == 0
    if chat:
        mct = get_int(body, "max_completion_tokens", 1, max_model_len, None)
        max_tokens = mct if mct is not None else max_tokens
    elif max_tokens is None:
        max_tokens = 16  # the legacy completions default
    n = get_int(body, "n", 1, MAX_N, 1) or 1
    stream = get_bool(body, "stream")
    include_usage = _stream_options(body, stream)
    logprobs = _logprobs(body, chat)
    seed = get_int(body, "seed", -(2**63), 2**64 - 1, None)
    top_k = get_int(body, "top_k", -1, 1 << 20, 0) or 0
    params = SamplingParams(
        max_tokens=1 if prompt_only else max_tokens or max_model_len,
        temperature=get_float(body, "temperature", 0.0, 2.0, 1.0),
        top_p=get_float(body, "top_p", 1e-9, 1.0, 1.0),
        top_k=max(top_k, 0),  # -1 (vLLM) means disabled, as 0 does
        min_p=get_float(body, "min_p", 0.0, 1.0, 0.0),
        repetition_penalty=get_float(body, "repetition_penalty", 1e-3, 10.0, 1.0),
        presence_penalty=get_float(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=get_float(body, "frequency_penalty", -2.0, 2.0, 0.0),
        seed=seed,  # the sampler maps any integer onto numpy's seed range
        stop=get_stop(body),
        ignore_eos=get_bool(body, "ignore_eos"),
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo else None,
        logit_bias=parse_logit_bias(body.get("logit_bias"), n_vocab),
        structured=constraints.structured,
    )
    return GenerationFields(model, n, stream, include_usage, max_tokens, logprobs, params,
                            constraints, echo, prompt_only)


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise invalid("stream_options", "'stream_options' must be an object")
    if not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    return get_bool(options, "include_usage")


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        top = get_int(body, "top_logprobs", 0, MAX_LOGPROBS, None)
        if not get_bool(body, "logprobs"):
            if top is not None:
                raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")
            return None
        return top or 0
    return get_int(body, "logprobs", 0, MAX_LOGPROBS, None)


def _reject_unsupported(body: dict[str, Any], chat: bool) -> None:
    """Fields that would change the answer must never be silently ignored."""
    if chat:
        for name in ("echo", "suffix"):
            if body.get(name) not in (None, False):
                raise invalid(name, f"'{name}' is only supported by /v1/completions")
    else:
        best_of = get_int(body, "best_of", 1, MAX_N, None)
        if best_of is not None and best_of != (body.get("n") or 1):
            raise invalid("best_of", "'best_of' other than n is not supported yet")
