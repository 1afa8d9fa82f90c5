"""What each soak request is: drawn from a seeded RNG so a run can be repeated.

Policy: `disconnect` of the normal requests hang up on purpose (early: while queued or in
prefill, before any byte comes back; mid-stream: after some events; non-streamed: a read
timeout mid-generation); `hostile` of them are malformed or abusive bodies that must get a 4xx.
Prompts are random common words (about a token each) so the prefix cache cannot serve them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from localinfer.server.loadgen import make_prompt

HOSTILE_KINDS = ("bad_json", "not_an_object", "overlong_prompt", "invalid_params",
                 "bad_token_ids", "oversized_body", "bad_messages", "unknown_model")
DISCONNECTS = ("early", "prefill", "mid_stream", "read_timeout")


@dataclass(slots=True)
class RequestSpec:
    kind: str  # "normal" | "disconnect" | "hostile" | "burst"
    path: str  # "/v1/chat/completions" | "/v1/completions"
    stream: bool
    body: bytes
    max_tokens: int = 0
    disconnect: str = ""  # one of DISCONNECTS for kind "disconnect"
    disconnect_after: float = 0.0  # seconds (early, prefill, read_timeout) or events (mid)
    hostile: str = ""  # one of HOSTILE_KINDS for kind "hostile"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Workload:
    model: str
    max_model_len: int
    disconnect_rate: float = 0.2
    hostile_rate: float = 0.05
    max_tokens: tuple[int, int] = (8, 160)
    prompt_tokens: tuple[int, int] = (4, 400)
    oversized_mb: float = 16.0

    def draw(self, rng: random.Random) -> RequestSpec:
        roll = rng.random()
        if roll < self.hostile_rate:
            return self.hostile(rng, rng.choice(HOSTILE_KINDS))
        spec = self.normal(rng)
        if roll < self.hostile_rate + self.disconnect_rate:
            self._disconnect(rng, spec)
        return spec

    def normal(self, rng: random.Random, kind: str = "normal",
               max_tokens: tuple[int, int] | None = None) -> RequestSpec:
        chat = rng.random() < 0.5
        stream = rng.random() < 0.6
        lo, hi = max_tokens or self.max_tokens
        n_out = rng.randint(lo, hi)
        # mostly short prompts, some long ones (prefill-heavy)
        n_prompt = rng.randint(*self.prompt_tokens) if rng.random() < 0.3 else rng.randint(
            self.prompt_tokens[0], 48)
        text = make_prompt(rng, n_prompt)
        body: dict[str, Any] = {"model": self.model, "max_tokens": n_out,
                                "temperature": rng.choice((0.0, 0.7, 1.0)), "stream": stream}
        if rng.random() < 0.5:
            body["ignore_eos"] = True  # full-length outputs keep the KV pool busy
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        return RequestSpec(kind, path, stream, _dump(body), n_out)

    def _disconnect(self, rng: random.Random, spec: RequestSpec) -> None:
        spec.kind = "disconnect"
        point = rng.choice(DISCONNECTS)
        if point == "mid_stream" and not spec.stream:
            point = "read_timeout"
        if point == "read_timeout" and spec.stream:
            point = "mid_stream"
        spec.disconnect = point
        if point == "early":
            spec.disconnect_after = rng.uniform(0.001, 0.05)
        elif point == "prefill":
            # a long prompt, hung up on while it is (most likely) being prefilled
            body = json.loads(spec.body)
            text = make_prompt(rng, rng.randint(300, max(min(self.max_model_len // 2, 900), 301)))
            if "messages" in body:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            spec.body = _dump(body)
            spec.disconnect_after = rng.uniform(0.02, 0.3)
        elif point == "mid_stream":
            spec.disconnect_after = rng.randint(1, max(spec.max_tokens // 2, 1))
        else:
            spec.disconnect_after = rng.uniform(0.1, 1.0)

    def hostile(self, rng: random.Random, what: str) -> RequestSpec:
        path = rng.choice(("/v1/chat/completions", "/v1/completions"))
        chat = path == "/v1/chat/completions"
        base: dict[str, Any] = {"model": self.model, "max_tokens": 8}
        if chat:
            base["messages"] = [{"role": "user", "content": "Hello"}]
        else:
            base["prompt"] = "Hello"
        body: bytes
        if what == "bad_json":
            body = rng.choice((b'{"model": ', b"{'a': 1}", b"\xff\xfe\x00garbage", b"",
                               b'{"max_tokens": 8,,}'))
        elif what == "not_an_object":
            body = rng.choice((b"[1, 2]", b"42", b"null", b'"text"'))
        elif what == "overlong_prompt":
            text = make_prompt(rng, 2 * self.max_model_len + 16)
            body = _dump({**base, **({"messages": [{"role": "user", "content": text}]}
                                     if chat else {"prompt": text})})
        elif what == "invalid_params":
            bad = rng.choice(({"max_tokens": -5}, {"max_tokens": 10**12}, {"temperature": -1},
                              {"n": 10**6}, {"top_p": 7}, {"seed": "abc"},
                              {"logprobs": True, "top_logprobs": 50} if chat else
                              {"logprobs": 50}, {"stop": 5}, {"stream": "yes"}))
            body = _dump({**base, **bad})
        elif what == "bad_token_ids":
            path, chat = "/v1/completions", False
            ids = rng.choice(([-1], [2**31], [1, 2, 10**9], [[1, -7]]))
            body = _dump({"model": self.model, "prompt": ids, "max_tokens": 8})
        elif what == "oversized_body":
            pad = "a" * int(self.oversized_mb * (1 << 20))
            body = _dump({**base, "user": pad})
        elif what == "bad_messages":
            path = "/v1/chat/completions"
            messages = rng.choice((None, "hi", [123], [{}], [{"role": 123, "content": "x"}]))
            body = _dump({"model": self.model, "messages": messages, "max_tokens": 8})
        elif what == "unknown_model":
            body = _dump({**base, "model": "no-such-model-" + str(rng.randint(0, 999))})
        else:
            raise ValueError(f"unknown hostile kind {what!r}")
        return RequestSpec("hostile", path, False, body, hostile=what,
                           headers={"content-type": "application/json"})


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()
