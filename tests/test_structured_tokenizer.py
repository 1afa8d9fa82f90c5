"""llguidance's view of the three catalog vocabularies (structured/tokenizer.py): SmolLM2 (gpt2
byte-level BPE, 49k), Qwen 2.5 (gpt2 BPE, 151k, unused padding ids, user-defined tool tags) and
Gemma 3 (SentencePiece with byte fallback, 262k). A wrong byte here lets the model write what the
grammar forbids (or forbids what it allows), so every token id is checked, then whole texts, then
grammars fed with our own tokenization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localinfer.gguf_file import open_gguf
from localinfer.structured import StructuredOutput
from localinfer.structured.guide import GuideFactory
from localinfer.structured.tokenizer import (
    SPECIAL_PREFIX,
    eog_ids,
    is_special,
    ll_tokenizer,
    token_bytes,
)
from localinfer.tokenizer import Tokenizer
from localinfer.tokenizer.vocab import TokenAttr

Vocab = tuple[str, Tokenizer, Any, list[bytes]]  # name, tokenizer, LLTokenizer, token_bytes

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"name": "Zoë", "tags": ["a", "b"], "n": -1.5e3, "ok": true, "none": null}',
    "  two leading spaces",
    " one leading space",
    "trailing spaces   ",
    "\n\nnewlines\n\n\n\tand a tab",
    "日本語のテキストと中文，한국어",
    "emoji 😀 family 👩‍👩‍👧 flag 🇫🇷",
    "café naïve Ångström ß ĳ",
    "<|im_end|> and <end_of_turn> as plain text",
    "▁ a literal U+2581 and \u00ff\u00fe",
    "x" * 50 + " " + "0123456789" * 5,
]


@pytest.fixture(scope="module", params=["smollm2", "qwen2", "gemma3"])
def vocab(request: pytest.FixtureRequest) -> Vocab:
    path: Path = request.getfixturevalue(f"{request.param}_path")
    with open_gguf(path) as g:
        tok = Tokenizer.from_gguf(g.metadata)
    return request.param, tok, ll_tokenizer(tok), token_bytes(tok)


def expected_special(tok: Tokenizer, i: int) -> bool:
    """Control and unknown tokens, and user-defined ones written like a tag."""
    attr = tok.vocab.attrs[i]
    if attr & TokenAttr.UNUSED:
        return False
    text = tok.vocab.tokens[i]
    return bool(attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN)) or bool(
        attr & TokenAttr.USER_DEFINED and text.startswith("<") and text.endswith(">"))


def lone_ff(tbytes: list[bytes]) -> set[int]:
    """The ordinary token that is just the byte 0xFF (gpt2 "ÿ", SentencePiece "<0xFF>"): llguidance
    reads its leading 0xFF as the special marker. Harmless, 0xFF never occurs in UTF-8 text, so no
    grammar can allow it either way."""
    return {i for i, b in enumerate(tbytes) if b == SPECIAL_PREFIX}


def allowed_ids(matcher: Any) -> set[int]:
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def test_every_token_decodes_to_our_bytes(vocab: Vocab) -> None:
    name, tok, ll, tbytes = vocab
    assert ll.vocab_size == tok.n_vocab == len(tbytes)
    ff = lone_ff(tbytes)
    assert len(ff) == (0 if name == "smollm2" else 1)
    n_special = n_unused = 0
    for i in range(tok.n_vocab):
        ours = tok.token_to_bytes(i)
        if tok.vocab.attrs[i] & TokenAttr.UNUSED:
            n_unused += 1
            assert tbytes[i] == b"", i  # never in the trie: no grammar allows it
            assert not ll.is_special_token(i), i
        elif expected_special(tok, i):
            n_special += 1
            assert tbytes[i] == SPECIAL_PREFIX + ours and ours, i
            assert ll.decode_bytes([i]) == ours, i
        elif i in ff:
            assert ll.decode_bytes([i]) == b"", i
        else:
            assert tbytes[i] == ours, i
            assert ll.decode_bytes([i]) == ours, (i, tok.vocab.tokens[i])
    assert n_special > 0
    assert (n_unused > 0) == (name == "qwen2")
    if name == "gemma3":  # byte fallback: <0x00>..<0xFF> are the bytes themselves
        for b in range(256):
            tid = tok.vocab.token_to_id[f"<0x{b:02X}>"]
            assert tok.token_to_bytes(tid) == bytes([b])
            if b != 0xFF:
                assert ll.decode_bytes([tid]) == bytes([b])
        assert ll.decode_bytes([tok.vocab.token_to_id["▁the"]]) == b" the"
    else:  # byte-level BPE: "Ġ" is a space, "Ċ" a newline
        assert ll.decode_bytes([tok.vocab.token_to_id["Ġthe"]]) == b" the"
        assert ll.decode_bytes([tok.vocab.token_to_id["Ċ"]]) == b"\n"


def test_special_tokens_are_control_unknown_and_tags(vocab: Vocab) -> None:
    name, tok, ll, tbytes = vocab
    want = {i for i in range(tok.n_vocab) if expected_special(tok, i)}
    assert {i for i in range(tok.n_vocab) if is_special(tok, i) and tbytes[i]} == want
    assert {i for i in range(tok.n_vocab) if ll.is_special_token(i)} == want | lone_ff(tbytes)
    # Tokenizer.is_special (what decode(skip_special=True) hides) is a subset: control, unknown
    assert {i for i in range(tok.n_vocab) if tok.is_special(i)} <= want
    ids = tok.vocab.token_to_id
    named = {
        "smollm2": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        "qwen2": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"],
        "gemma3": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>"],
    }[name]
    for text in named:
        assert ll.is_special_token(ids[text]), text
        assert ll.decode_bytes([ids[text]]) == text.encode()
    if name == "qwen2":  # user-defined tags are special although not control tokens
        assert tok.vocab.attrs[ids["<tool_call>"]] & TokenAttr.USER_DEFINED
    if name == "gemma3":  # user-defined but not a tag: ordinary text (runs of newlines)
        for text in ["\n\n", "\n\n\n"]:
            assert tok.vocab.attrs[ids[text]] & TokenAttr.USER_DEFINED
            assert not ll.is_special_token(ids[text])
            assert ll.decode_bytes([ids[text]]) == text.encode()


def test_eos_tokens_are_our_eog_set(vocab: Vocab) -> None:
    name, tok, ll, _ = vocab
    assert set(ll.eos_tokens) == set(tok.eog_ids) == set(eog_ids(tok))
    assert ll.eos_token == tok.eos_id == eog_ids(tok)[0]
    ids = tok.vocab.token_to_id
    end = {"smollm2": "<|im_end|>", "qwen2": "<|im_end|>", "gemma3": "<end_of_turn>"}[name]
    assert ids[end] in ll.eos_tokens


@pytest.mark.parametrize("text", TEXTS)
def test_texts_roundtrip_through_llguidance(vocab: Vocab, text: str) -> None:
    name, tok, ll, _ = vocab
    ids = tok.encode(text, add_special=False, parse_special=False)
    # SentencePiece escapes spaces as "▁", so a literal "▁" comes back a space (as in llama.cpp)
    want = text.replace("▁", " ") if name == "gemma3" else text
    assert tok.decode(ids) == want
    assert ll.decode_bytes(ids) == want.encode("utf-8")
    assert ll.decode_str(ids) == want
    assert ll.tokenize_str(text) == ids
    assert not any(ll.is_special_token(i) for i in ids)  # text never yields a special token


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "home": {"type": "object", "properties": {"city": {"type": "string"}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def doc_ids(tok: Tokenizer, doc: object) -> list[int]:
    # the engine's JSON style (structured/spec.py JSON_STYLE) is json.dumps's default layout
    return tok.encode(json.dumps(doc, ensure_ascii=False), add_special=False, parse_special=False)


@pytest.mark.parametrize("doc", [
    {"name": "Zoë 日本 😀", "age": 42, "tags": ["x", "  y", "\n"], "home": {"city": "Zürich"}},
    {"name": "", "age": 0},
    {"name": "Bob", "age": 150, "tags": []},
])
def test_json_schema_matcher_accepts_our_tokens(vocab: Vocab, doc: dict[str, Any]) -> None:
    _, tok, _, _ = vocab
    guide = GuideFactory(tok).guide(StructuredOutput(json=PERSON))
    ids = doc_ids(tok, doc)
    assert guide.matcher.consume_tokens(ids), guide.error
    assert guide.matcher.is_accepting() and not guide.error
    assert guide.consume(tok.eos_id) and guide.is_stopped and not guide.error


@pytest.mark.parametrize(("doc", "at_end"), [
    ({"name": "Bob", "age": 151}, False),  # above maximum
    ({"name": "Bob", "age": "42"}, False),  # wrong type
    ({"name": "Bob", "age": 1, "extra": 1}, False),  # additionalProperties: false
    ({"name": "x" * 21, "age": 1}, False),  # maxLength
    ({"name": "Bob", "age": 1, "tags": ["a"] * 5}, False),  # maxItems
    ({"name": "Bob"}, True),  # a required field missing: refused at the closing brace
])
def test_json_schema_matcher_rejects_invalid(vocab: Vocab, doc: dict[str, Any],
                                            at_end: bool) -> None:
    _, tok, _, _ = vocab
    guide = GuideFactory(tok).guide(StructuredOutput(json=PERSON))
    ids = doc_ids(tok, doc)
    assert not guide.matcher.consume_tokens(ids)
    assert guide.matcher.is_error() and guide.error
    # the same tokens minus the offending tail are a valid prefix, not a complete document
    prefix = GuideFactory(tok).guide(StructuredOutput(json=PERSON))
    n_ok = prefix.matcher.validate_tokens(ids)
    assert 0 < n_ok < len(ids)
    assert prefix.matcher.consume_tokens(ids[:n_ok]) and not prefix.matcher.is_accepting()
    assert not at_end or n_ok == len(ids) - 1


@pytest.mark.parametrize(("regex", "good", "bad"), [
    ("é+|日本", ["é", "ééé", "日本"], ["e", "日本語", "日", "éé日本"]),
    (r"[α-ω]{2,4}-\d+ ✓", ["αβ-12 ✓", "ωωωω-0 ✓"], ["α-1 ✓", "αβ-12 x"]),
    (r"(?:😀|🇫🇷) ?[A-Za-zäöü]+", ["😀 hallo", "🇫🇷bonjour", "😀 Grün"], ["😀  x", "🇫 x"]),
])
def test_unicode_regex_accepts_our_tokens(vocab: Vocab, regex: str, good: list[str],
                                          bad: list[str]) -> None:
    _, tok, _, _ = vocab
    factory = GuideFactory(tok)
    for text in good:
        guide = factory.guide(StructuredOutput(regex=regex))
        ids = tok.encode(text, add_special=False, parse_special=False)
        assert guide.matcher.consume_tokens(ids) and guide.matcher.is_accepting(), text
    for text in bad:
        guide = factory.guide(StructuredOutput(regex=regex))
        ids = tok.encode(text, add_special=False, parse_special=False)
        ok = guide.matcher.consume_tokens(ids)
        assert not (ok and guide.matcher.is_accepting()), text


def test_choice_mask_is_exactly_the_prefix_tokens(vocab: Vocab) -> None:
    """At the start of a choice every token whose bytes begin an option is allowed, and no
    other: the trie llguidance walks holds exactly our token bytes."""
    _, tok, _, tbytes = vocab
    options = ["yes", "no", " maybe so", "日本語", "\n\t- item"]
    guide = GuideFactory(tok).guide(StructuredOutput(choice=options))
    encoded = [o.encode() for o in options]
    want = {i for i, b in enumerate(tbytes)
            if b and not b.startswith(SPECIAL_PREFIX) and any(o.startswith(b) for o in encoded)}
    assert len(want) >= len(options)
    assert allowed_ids(guide.matcher) == want
    # after "no" the grammar is complete: only the end-of-generation tokens remain
    assert guide.matcher.consume_tokens(tok.encode("no", add_special=False))
    assert guide.is_stopped and allowed_ids(guide.matcher) == set(tok.eog_ids)
