"""Structured output through the engine on a real model (SmolLM2-135M): every kind of constraint
gives output that validates, a constraint cut by max_tokens leaves a prefix the grammar allows,
constrained and free requests batch (and survive preemption) without changing each other's
greedy output, bad constraints fail at once and leave nothing behind, a matcher failure ends only
its own sequence; and the mask kernel against a numpy reference."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from localinfer import LLM, SamplingParams
from localinfer.errors import InvalidRequestError
from localinfer.llm import Prompt
from localinfer.structured import StructuredOutput, StructuredOutputError
from localinfer.structured.apply_mask import apply_bitmasks
from localinfer.structured.guide import Guide
from localinfer.structured.masks import Masker

# 28 blocks of 16 tokens: a few requests at a time fit, eight long ones force preemption.
# 64 batched tokens: long prompts prefill in chunks beside the decodes of other sequences.
# One model thread: the masks are filled on another thread while the forward pass runs, and a
# 2-thread forward pass on a busy 2-core machine spins (30x slower measured); 135M needs no more.
KV_CACHE_MB = 10
MAX_BATCHED = 64
THREADS = 1


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[LLM]:
    with LLM(str(smollm2_path), max_model_len=512, kv_cache_mb=KV_CACHE_MB, max_num_seqs=8,
             max_num_batched_tokens=MAX_BATCHED, threads=THREADS) as model:
        yield model


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None


def assert_idle(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    assert not engine.scheduler.seqs and not engine.streams
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_blocks


def run(llm: LLM, requests: list[tuple[Prompt, SamplingParams]]) -> list[Result]:
    """Drive the engine by hand with every request at once (each with its own params)."""
    engine = llm.engine
    ids = [engine.add_request(llm.encode(p), params) for p, params in requests]
    results = {i: Result([], "", None) for i in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            r = results[out.seq_id]
            r.token_ids += out.token_ids
            r.text += out.text
            if out.error is not None:
                r.error = out.error
            if out.finished:
                r.finish_reason = out.finish_reason
    assert_idle(llm)
    return [results[i] for i in ids]


def greedy(spec: StructuredOutput | None, max_tokens: int = 48) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured=spec)


def fresh_matcher(llm: LLM, spec: StructuredOutput) -> Any:
    return llm.engine.guides.prepare(spec).deep_copy()


def assert_grammar_accepts(llm: LLM, spec: StructuredOutput, token_ids: list[int],
                           complete: bool = True) -> None:
    """The tokens replay through a fresh matcher of the same constraint."""
    matcher = fresh_matcher(llm, spec)
    eog = set(llm.tokenizer.eog_ids)
    body = token_ids[:-1] if token_ids and token_ids[-1] in eog else token_ids
    assert matcher.consume_tokens(body), matcher.get_error()
    assert matcher.is_accepting() == complete


# --- every kind of constraint validates --------------------------------------------------------

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 40, "maximum": 45},
        "role": {"enum": ["admin", "editor", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,6}$"},
                 "minItems": 2, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "vip": {"type": "boolean"},  # optional
        "score": {"type": "number", "minimum": 0, "maximum": 1},  # optional
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("prompt", [
    chat("Alice is 30 and lives in Paris. Give her record as JSON."),  # age 30 is out of range
    chat("Write a poem about the sea."),  # nothing to do with JSON
    "Once upon a time",  # a raw prompt, no chat template
])
def test_json_schema(llm: LLM, prompt: Prompt) -> None:
    spec = StructuredOutput(json=PERSON)
    out = llm.generate(prompt, greedy(spec, max_tokens=96))[0]
    assert out.finish_reason == "stop", out.text
    doc = json.loads(out.text)
    jsonschema.validate(doc, PERSON)
    assert 40 <= doc["age"] <= 45 and 2 <= len(doc["tags"]) <= 3
    assert_grammar_accepts(llm, spec, out.token_ids)


def test_json_schema_as_text_and_array_bounds(llm: LLM) -> None:
    schema = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9},
              "minItems": 3, "maxItems": 4}
    spec = StructuredOutput(json=json.dumps(schema))  # the schema's text works as well
    for prompt in [chat("List the numbers from 1 to 10."), chat("Name one number.")]:
        out = llm.generate(prompt, greedy(spec))[0]
        assert out.finish_reason == "stop", out.text
        doc = json.loads(out.text)
        jsonschema.validate(doc, schema)


@pytest.mark.parametrize("prompt", [
    chat("Give a JSON object with the keys a and b, both numbers."),
    chat("What is the capital of France? Answer in JSON."),
])
def test_json_object(llm: LLM, prompt: Prompt) -> None:
    out = llm.generate(prompt, greedy(StructuredOutput(json_object=True)))[0]
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict)


@pytest.mark.parametrize(("regex", "prompts"), [
    (r"\d{4}-\d{2}-\d{2}", [chat("When did WW2 end?"), "Date:"]),
    (r"\(\d{3}\) \d{3}-\d{4}", ["Call me at", chat("What is your phone number?")]),
    (r"[A-Z][a-zé]{2,10} (?:日本|東京|café)", [chat("Name a city."), "Hello"]),
    (r"(?:yes|no), because [a-z ]{5,20}\.", [chat("Is water wet?")]),
])
def test_regex(llm: LLM, regex: str, prompts: list[Prompt]) -> None:
    spec = StructuredOutput(regex=regex)
    for out in llm.generate(prompts, greedy(spec)):
        assert out.finish_reason == "stop", out.text
        assert re.fullmatch(regex, out.text), out.text
        assert_grammar_accepts(llm, spec, out.token_ids)


def test_choice(llm: LLM) -> None:
    options = ["yes", "yes, definitely", "no", "🙂 maybe"]
    prompts: list[Prompt] = [chat("Is the sky blue?"), "Question: is fire cold? Answer:",
                             chat("Will it rain tomorrow?")]
    for out in llm.generate(prompts, greedy(StructuredOutput(choice=options))):
        assert out.finish_reason == "stop"
        assert out.text in options


ANSWER = """
start: "The answer is " answer "."
answer: NUMBER " " UNIT | "unknown"
NUMBER: /[1-9][0-9]{0,2}/
UNIT: "cm" | "kg" | "km"
"""
ANSWER_RE = r"The answer is (?:[1-9][0-9]{0,2} (?:cm|kg|km)|unknown)\."
RESULT = """
start: "Result: " obj
obj: %json {"x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}, "type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": false}
"""


def test_lark_grammar(llm: LLM) -> None:
    prompts: list[Prompt] = [chat("How tall is a door?"), "Q: weight of a cat?\nA:",
                             chat("How far is the moon?")]
    for out in llm.generate(prompts, greedy(StructuredOutput(grammar=ANSWER))):
        assert out.finish_reason == "stop"
        assert re.fullmatch(ANSWER_RE, out.text), out.text
    out = llm.generate(chat("Did it work?"), greedy(StructuredOutput(grammar=RESULT)))[0]
    assert out.finish_reason == "stop" and out.text.startswith("Result: "), out.text
    doc = json.loads(out.text.removeprefix("Result: "))
    assert isinstance(doc["ok"], bool) and 0 <= doc["n"] <= 9 and set(doc) == {"ok", "n"}
    assert out.text == f"Result: {json.dumps(doc)}"  # the layout x-guidance asked for


# --- cut by max_tokens -------------------------------------------------------------------------

def test_length_leaves_a_prefix_the_grammar_allows(llm: LLM) -> None:
    words = StructuredOutput(regex=r"[a-z]{100}")
    out = llm.generate(chat("Spell a long word."), greedy(words, max_tokens=8))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8
    assert re.fullmatch(r"[a-z]{1,99}", out.text), out.text
    assert_grammar_accepts(llm, words, out.token_ids, complete=False)

    long = {"type": "array", "items": {"type": "integer"}, "minItems": 30}
    spec = StructuredOutput(json=long)
    out = llm.generate(chat("Count to three."), greedy(spec, max_tokens=16))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 16
    assert out.text.startswith("[") and not out.text.endswith("]")
    assert_grammar_accepts(llm, spec, out.token_ids, complete=False)


# --- batching and preemption -------------------------------------------------------------------

MIXED: list[tuple[Prompt, SamplingParams]] = [
    (chat("Alice is 30 and lives in Paris. Give her record as JSON."),
     greedy(StructuredOutput(json=PERSON), max_tokens=96)),
    (chat("Tell me about the sea."), greedy(None)),
    ("Date:", greedy(StructuredOutput(regex=r"\d{4}-\d{2}-\d{2}"))),
    ("Once upon a time", greedy(None, max_tokens=32)),
    (chat("Is the sky blue?"), greedy(StructuredOutput(choice=["yes", "no"]))),
    (chat("How tall is a door? " * 8), greedy(StructuredOutput(grammar=ANSWER))),  # chunked
]


def check_valid(params: SamplingParams, r: Result) -> None:
    spec = params.structured
    if spec is None:
        return
    assert r.finish_reason == "stop", r.text
    if spec.json is not None:
        jsonschema.validate(json.loads(r.text), spec.schema())
    elif spec.regex is not None:
        assert re.fullmatch(spec.regex, r.text), r.text
    elif spec.choice is not None:
        assert r.text in spec.choice
    else:
        assert re.fullmatch(ANSWER_RE, r.text), r.text


def test_mixed_batch_equals_each_request_alone(llm: LLM) -> None:
    together = run(llm, MIXED)
    for (prompt, params), got in zip(MIXED, together, strict=True):
        alone = run(llm, [(prompt, params)])[0]
        assert got == alone, prompt
        check_valid(params, got)
    free = [r for (_, p), r in zip(MIXED, together, strict=True) if p.structured is None]
    assert all(r.text and r.error is None for r in free)


PREEMPT_PROMPTS = [f"Write {n} {topic} as a JSON list, one word each. " * 5 for n, topic in
                   zip(range(3, 11), ["cats", "dogs", "rivers", "stars", "fruits", "songs",
                                      "trees", "boats"], strict=True)]
WORDS: dict[str, Any] = {
    "type": "object",
    "properties": {"items": {"type": "array", "minItems": 6, "maxItems": 8,
                             "items": {"type": "string", "pattern": "^[a-z]{3,8}$"}},
                   "count": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["items", "count"],
    "additionalProperties": False,
}


def test_preemption_keeps_constrained_outputs(llm: LLM) -> None:
    requests: list[tuple[Prompt, SamplingParams]] = [
        (p, greedy(StructuredOutput(json=WORDS)) if i % 2 == 0
         else greedy(StructuredOutput(regex=r"(?:[a-z]+ ){6,8}[a-z]+\.")))
        for i, p in enumerate(PREEMPT_PROMPTS)]
    # eight ~(66 + 20)-token requests need ~48 blocks of the 28 there are
    assert llm.engine.block_manager.num_blocks < 8 * 4
    before = llm.engine.scheduler.num_preemptions
    together = run(llm, requests)
    assert llm.engine.scheduler.num_preemptions > before
    # the same requests four at a time, which fit: never preempted
    unpreempted = []
    for half in (requests[:4], requests[4:]):
        before = llm.engine.scheduler.num_preemptions
        unpreempted += run(llm, half)
        assert llm.engine.scheduler.num_preemptions == before
    for (prompt, params), got, want in zip(requests, together, unpreempted, strict=True):
        assert got.error is None
        assert got == want, prompt
        # a greedy tiny model may loop inside the constraint ("bibibib", ... on the native AVX2
        # pair) until max_tokens: then what it gave must still be a prefix the grammar allows
        if got.finish_reason == "length":
            assert params.structured is not None
            assert_grammar_accepts(llm, params.structured, got.token_ids, complete=False)
        else:
            check_valid(params, got)


# --- bad constraints ---------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "named"), [
    ({"json": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
     "uniqueItems"),
    ({"json": {"type": "object", "not": {"required": ["a"]}}}, '"not"'),
    ({"json": {"type": "integer", "minimum": "zero"}}, "minimum"),
    ({"json": {"type": "colour"}}, "colour"),
    ({"json": {"properties": {"a": {"$ref": "#/$defs/missing"}}}}, "/$defs/missing"),
    ({"json": {"type": "string", "pattern": "(?=a)b"}}, "look-around"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"regex": r"(?<!x)a+"}, "look-around"),
    ({"regex": r"(a"}, "unclosed group"),
    ({"grammar": 'start: greeting name\ngreeting: "hi "'}, '"name"'),
    ({"grammar": "start: ("}, "grammar"),
])
def test_bad_constraint_raises_and_leaves_nothing_running(llm: LLM, kwargs: dict[str, Any],
                                                          named: str) -> None:
    params = greedy(StructuredOutput(**kwargs))
    with pytest.raises(StructuredOutputError, match=re.escape(named)) as info:
        llm.generate(["Hello", chat("Hi")], params)
    assert isinstance(info.value, InvalidRequestError)  # the server answers 400
    assert_idle(llm)
    with pytest.raises(StructuredOutputError, match=re.escape(named)):
        llm.engine.add_request(llm.encode("Hello"), params)
    assert_idle(llm)


def test_invalid_specs_are_refused_when_built() -> None:
    with pytest.raises(StructuredOutputError, match="exactly one"):
        StructuredOutput(json={"type": "object"}, regex="a")
    with pytest.raises(StructuredOutputError, match="exactly one"):
        StructuredOutput()
    for choice in [[], ["a", ""], "abc", ["a", 1]]:
        with pytest.raises(StructuredOutputError, match="choice"):
            StructuredOutput(choice=choice)  # type: ignore[arg-type]
    with pytest.raises(StructuredOutputError, match="regex"):
        StructuredOutput(regex="")
    with pytest.raises(InvalidRequestError, match="structured"):
        SamplingParams(structured={"json": {}}).validate()  # type: ignore[arg-type]


# --- a matcher failure ends only its own sequence ----------------------------------------------

class RefusingGuide(Guide):
    """A real matcher (it fills the masks) that refuses the token after `accept` of them, as a
    matcher hitting an llguidance limit would."""

    def __init__(self, matcher: Any, accept: int) -> None:
        super().__init__(matcher)
        self.accept = accept

    def consume(self, token_id: int) -> bool:
        if self.accept == 0:
            return False
        self.accept -= 1
        return super().consume(token_id)


SENTENCE = StructuredOutput(regex=r"[A-Z][a-z]{1,10}(?: [a-z]{1,10}){4,8}\.")
TWO = [(chat("Write a sentence about cats."), greedy(SENTENCE)),
       (chat("Write a sentence about dogs."), greedy(SENTENCE)),
       (chat("Tell me about the sea."), greedy(None, max_tokens=16))]


def step_with_tampering(llm: LLM, tamper: Any) -> tuple[int, list[Result]]:
    """Add TWO, step until every request has a token, tamper with the first request's sequence,
    then run to the end; returns how many tokens the first had before the tampering."""
    engine = llm.engine
    ids = [engine.add_request(llm.encode(p), params) for p, params in TWO]
    results = {i: Result([], "", None) for i in ids}

    def collect(outs: list[Any]) -> None:
        for out in outs:
            r = results[out.seq_id]
            r.token_ids += out.token_ids
            r.text += out.text
            r.error = out.error if out.error is not None else r.error
            if out.finished:
                r.finish_reason = out.finish_reason

    while not all(results[i].token_ids for i in ids):
        collect(engine.step())
    n_before = len(results[ids[0]].token_ids)
    tamper(engine.scheduler.seqs[ids[0]])
    while engine.has_unfinished_requests():
        collect(engine.step())
    assert_idle(llm)
    return n_before, [results[i] for i in ids]


def test_refused_token_ends_only_its_sequence(llm: LLM) -> None:
    alone = [run(llm, [r])[0] for r in TWO]

    def refuse(seq: Any) -> None:
        seq.guide = RefusingGuide(seq.guide.matcher, accept=2)

    n_before, (bad, *others) = step_with_tampering(llm, refuse)
    assert bad.finish_reason == "abort"
    assert bad.error is not None and "structured output failed" in bad.error
    assert len(bad.token_ids) == n_before + 3  # 2 accepted, then the refused one
    assert bad.token_ids == alone[0].token_ids[:n_before + 3]
    assert others == alone[1:]
    check_valid(TWO[1][1], others[0])


def test_refusal_raises_from_generate(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    factory = llm.engine.guides
    real = factory.guide
    monkeypatch.setattr(factory, "guide", lambda spec: RefusingGuide(real(spec).matcher, 3))
    with pytest.raises(StructuredOutputError, match="structured output failed"):
        llm.generate([chat("Write a sentence about cats."), "Hello"], greedy(SENTENCE))
    assert_idle(llm)
    monkeypatch.undo()
    out = llm.generate(chat("Write a sentence about cats."), greedy(SENTENCE))[0]
    assert out.finish_reason == "stop" and re.fullmatch(SENTENCE.regex or "", out.text)


def test_matcher_in_error_state_ends_its_sequence_with_the_error(llm: LLM) -> None:
    bad_token = llm.tokenizer.encode("123", add_special=False, parse_special=False)[0]

    def break_matcher(seq: Any) -> None:
        assert not seq.guide.matcher.consume_token(bad_token)
        assert seq.guide.matcher.is_error()

    _, (bad, *others) = step_with_tampering(llm, break_matcher)
    assert others == [run(llm, [r])[0] for r in TWO[1:]]
    assert bad.finish_reason == "abort" and bad.error is not None, bad


# --- masks -------------------------------------------------------------------------------------

def reference_mask(logits: np.ndarray, rows: np.ndarray, masks: np.ndarray,
                   mask_rows: np.ndarray) -> np.ndarray:
    out = logits.copy()
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little").astype(bool)
    for r, m in zip(rows, mask_rows, strict=True):
        allowed = np.zeros(logits.shape[1], bool)
        n = min(bits.shape[1], logits.shape[1])
        allowed[:n] = bits[m, :n]
        out[r, ~allowed] = -np.inf
    return out


@pytest.mark.parametrize(("n_tokens", "width"), [
    (49152, 49152),  # a multiple of 32
    (49155, 49155),  # a partial last word
    (49155, 49216),  # a padded output layer: the columns past the vocabulary are disallowed
    (151665, 151936),
    (40, 40),
])
def test_apply_bitmasks_matches_numpy(n_tokens: int, width: int) -> None:
    rng = np.random.default_rng(n_tokens + width)
    n_words = (n_tokens + 31) // 32
    masks = rng.integers(-(2**31), 2**31, size=(4, n_words), dtype=np.int64).astype(np.int32)
    masks[0, ::3] = 0  # whole words disallowed
    masks[1, :] = -1  # free text
    masks[2, 1::2] = np.int32(-(2**31))  # only bit 31
    masks[3, :] = 0
    masks[3, n_words // 2] = 1 << 5  # a single token
    tail = n_tokens % 32
    if tail:  # llguidance leaves the bits past the vocabulary zero
        masks[:, -1] &= np.int32((1 << tail) - 1)
    logits = rng.standard_normal((6, width)).astype(np.float32)
    rows = np.array([0, 2, 3, 4, 5], np.int64)  # row 1 is not sampled: left alone
    mask_rows = np.array([0, 1, 2, 3, 0], np.int64)  # two rows share a mask
    want = reference_mask(logits, rows, masks, mask_rows)
    apply_bitmasks(logits, rows, masks, mask_rows)
    np.testing.assert_array_equal(logits, want)
    assert np.isfinite(logits[1]).all()
    assert np.isfinite(logits[4]).sum() == 1 and np.isfinite(logits[4, 32 * (n_words // 2) + 5])
    assert np.isinf(logits[3, n_tokens:]).all()


def test_masker_fills_what_the_matchers_allow(llm: LLM) -> None:
    tok = llm.tokenizer
    factory = llm.engine.guides
    guides = [factory.guide(StructuredOutput(json=PERSON)),
              factory.guide(StructuredOutput(choice=["yes", "no"])),
              factory.guide(StructuredOutput(regex=r"\d{4}-\d{2}"))]
    assert guides[0].matcher.consume_tokens(
        tok.encode('{"name": "Al', add_special=False, parse_special=False))
    assert guides[2].matcher.consume_tokens(tok.encode("2024", add_special=False))
    n_vocab = factory.ll_tokenizer.vocab_size
    for overlap in (True, False):
        masker = Masker(n_vocab, runner_threads=1, overlap=overlap)
        masker.start(guides, (0, 1, 2))
        logits = np.zeros((4, n_vocab + 40), np.float32)
        masker.apply(logits, [(0, 2), (1, 0), (3, 1)])
        masker.stats.record(3, 0.0)
        masker.close()
        for row, guide in [(0, guides[2]), (1, guides[0]), (3, guides[1])]:
            bits = np.unpackbits(np.frombuffer(guide.matcher.compute_bitmask(), np.uint8),
                                 bitorder="little")[:n_vocab].astype(bool)
            np.testing.assert_array_equal(np.isfinite(logits[row, :n_vocab]), bits)
            assert np.isinf(logits[row, n_vocab:]).all()
        assert np.isfinite(logits[2]).all()
        allowed = np.flatnonzero(np.isfinite(logits[0]))
        assert allowed.size and all(tok.decode([int(t)]).startswith("-") for t in allowed)
        assert masker.stats.steps == 1 and masker.stats.seq_steps == 3
