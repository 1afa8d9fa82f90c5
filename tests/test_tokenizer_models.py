"""Tokenizers of the other catalog families against llama.cpp: Gemma 3 (SentencePiece-style
"llama" model) and Qwen 2.5 (byte-level BPE with the qwen2 pre-tokenizer)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_tokenizer import CORPUS

from localinfer.gguf_file import open_gguf
from localinfer.tokenizer import IncrementalDetokenizer, Tokenizer

EXTRA = [
    "<start_of_turn>user\nHello  there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "  two leading spaces", "trailing spaces   ", "\n\n\t x", "日本語のテキストと中文", "emoji 👩‍👩‍👧 ok",
    "    def f(x):\n        return x ** 2  # square\n",
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abc XYZ 123 \n\t,.!?日本😀é<>_-'\"▁"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


@pytest.fixture(scope="module", params=["gemma3", "qwen2"])
def pair(request):
    import llama_cpp

    path: Path = request.getfixturevalue(f"{request.param}_path")
    with open_gguf(path) as g:
        tok = Tokenizer.from_gguf(g.metadata)
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return request.param, tok, ref


@pytest.mark.parametrize(("add_special", "parse_special"), [(True, True), (False, False), (True, False)])
def test_ids_match_llama_cpp(pair, add_special: bool, parse_special: bool) -> None:
    _, tok, ref = pair
    for text in [*CORPUS, *EXTRA, *random_texts(200)]:
        ours = tok.encode(text, add_special=add_special, parse_special=parse_special)
        theirs = ref.tokenize(text.encode(), add_bos=add_special, special=parse_special)
        assert ours == theirs, text


def test_special_ids_and_roundtrip(pair) -> None:
    name, tok, ref = pair
    assert tok.bos_id == ref.token_bos() or not tok.add_bos
    assert tok.eos_id == ref.token_eos()
    assert tok.eos_id in tok.eog_ids
    if name == "gemma3":
        assert tok.add_bos and tok.encode("hi")[0] == tok.bos_id
        assert tok.vocab.token_to_id["<end_of_turn>"] in tok.eog_ids
    for text in [*CORPUS, *EXTRA]:
        ids = tok.encode(text, add_special=False, parse_special=True)
        assert tok.decode(ids) == text
        detok = IncrementalDetokenizer(tok)
        assert "".join(detok.add(i) for i in ids) + detok.flush() == text


@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2"])
def test_cached_tokenizer_matches_the_built_one(request, model: str, tmp_path, monkeypatch):
    """The tokenizer cache's entry for each catalog model gives a tokenizer identical in
    behaviour to the one built from the metadata (tests/test_tokenizer.py, the tiny models)."""
    from test_tokenizer import assert_same_tokenizer

    from localinfer.tokenizer.cache import load_tokenizer

    path: Path = request.getfixturevalue(f"{model}_path")
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path))
    monkeypatch.delenv("LOCALINFER_TOKENIZER_CACHE", raising=False)
    with open_gguf(path) as g:
        built = Tokenizer.from_gguf(g.metadata)
        load_tokenizer(g)  # a miss: builds and writes the entry
        assert len(list((tmp_path / "tokenizers").glob("*.ltc"))) == 1
        monkeypatch.setattr(Tokenizer, "from_gguf", staticmethod(lambda md: pytest.fail("built")))
        cached = load_tokenizer(g)
    assert_same_tokenizer(built, cached, [*CORPUS, *EXTRA, *random_texts(200, seed=1)])
