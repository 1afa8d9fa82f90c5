"""Tokenizer: token-for-token parity with llama.cpp, round trips, streaming decode, bad metadata."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localinfer.errors import InvalidRequestError, TokenizerError
from localinfer.gguf_file import open_gguf
from localinfer.tokenizer import IncrementalDetokenizer, Tokenizer
from localinfer.tokenizer.bpe import BYTE_TO_CHAR

CORPUS = [
    "",
    "Hello world",
    " leading space",
    "trailing spaces   ",
    "  multiple   spaces\t\ttabs \t mixed\n\n\nnewlines\r\n\r\nwindows  \n",
    "\t\t\tindented\n    four spaces\n        eight",
    " " * 37 + "x" + "\n" * 9 + "y" + "\t" * 5,
    "12345678901234567890 3.14159265 1,000,000 0x1F -42 1e-9 2024-01-31",
    "I'm here, they're gone; it's fine. We'll've been. DON'T SHOUT'S 'quoted'",
    "Punctuation!!! ?? ... --- (parens) [brackets] {braces} <angle> @#$%^&*_+=|\\/~`",
    'def fib(n: int) -> int:\n    """Doc."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n',
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n}\n",
    "const f = async (a, b) => { await fetch(`/api/${a}?q=${b}`); };",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇩🇪 ❤️",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "Ça va? naïve café, Ærøskøbing, Straße, ĳ, İstanbul, ǅ",
    "مرحبا بالعالم — שלום עולם — Привет, мир! — Γειά σου κόσμε",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "text<|endoftext|>more<|im_start|><|im_end|><|im_", "<repo_name>x<file_sep>y<reponame>",
    "\u00a0non\u2009breaking\u3000ideographic\u2028line\u2029para\x0bvt\x0cff\x85nel",
    "control\x00\x01\x07chars\x1b[0m\x7f",
    "ﬁ ligature, Ⅻ roman, ² superscript, ٣ arabic digit, ⁵⁄₈",
]
# Bytes the SmolLM2 vocabulary has no token for: llama.cpp drops them, so no round trip.
NO_TOKEN_CHARS = "\x04\x06\x13\x14\x16\x1d"
PRE_VARIANTS = ["qwen2", "llama-bpe", "default", "gpt-2"]


@pytest.fixture(scope="module")
def metadata(smollm2_path: Path) -> dict:
    with open_gguf(smollm2_path) as g:
        return dict(g.metadata)


@pytest.fixture(scope="module")
def tok(metadata: dict) -> Tokenizer:
    return Tokenizer.from_gguf(metadata)


def _vocab_only(path: Path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def ref(smollm2_path: Path):
    return _vocab_only(smollm2_path)


def _ref_encode(ref, text: str, add_special: bool, parse_special: bool) -> list[int]:
    return ref.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)


# ---- parity with llama.cpp ---------------------------------------------------------------------
@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("add_special", [False, True])
def test_corpus_matches_llama_cpp(tok, ref, add_special, parse_special):
    for text in CORPUS:
        ours = tok.encode(text, add_special=add_special, parse_special=parse_special)
        assert ours == _ref_encode(ref, text, add_special, parse_special), repr(text)


def test_long_text_matches_llama_cpp(tok, ref):
    text = "\n".join(CORPUS) * 20 + Path(__file__).read_text()
    assert tok.encode(text) == _ref_encode(ref, text, True, True)
    assert tok.decode(tok.encode(text, parse_special=False)) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60), parse_special=st.booleans())
def test_random_text_matches_llama_cpp(tok, ref, text, parse_special):
    assert tok.encode(text, False, parse_special) == _ref_encode(ref, text, False, parse_special)


def _fuzz_texts(seed: int, n: int) -> list[str]:
    pools = [
        " \t\n\r\x0b\x0c\x1c\x85\xa0\u2000\u2028\u3000", "abcXYZ'sStTrReEvVmMlLdD",
        "0123456789\u0660\u00b2\u2155\u216b\uff11\U0001d7ce", "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
        "éàüßøÅçñ\u0301\u0308\u0915\u093e\u05d0\u0627", "日本語中文한국어\U00020000\U00031350",
        "😀👨\u200d👩\ufe0f", "\u0378\u0558\ue000\U0010fffd\x00\x07",
    ]
    rng = random.Random(seed)
    return [
        "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 50)))
        for _ in range(n)
    ]


def test_fuzz_matches_llama_cpp(tok, ref):
    for text in _fuzz_texts(0, 1000):
        assert tok.encode(text, False, True) == _ref_encode(ref, text, False, True), repr(text)


@pytest.fixture(scope="module")
def gguf_fields(smollm2_path: Path) -> list:
    gguf = pytest.importorskip("gguf")
    fields = []
    for key, field in gguf.GGUFReader(smollm2_path).fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            vtype = field.types[0]
            sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
            fields.append((key, field.contents(), vtype, sub))
    return fields


@pytest.fixture(scope="module", params=PRE_VARIANTS)
def pre_variant(request, gguf_fields: list, tmp_path_factory):
    """SmolLM2's vocabulary relabelled with another pre-tokenizer, through both tokenizers."""
    import gguf

    path = tmp_path_factory.mktemp("vocab") / f"{request.param}.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    for key, value, vtype, sub in gguf_fields:
        value = request.param if key == "tokenizer.ggml.pre" else value
        writer.add_key_value(key, value, vtype, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with open_gguf(path) as g:
        ours = Tokenizer.from_gguf(g.metadata)
    return ours, _vocab_only(path)


def test_other_pre_tokenizers_match_llama_cpp(pre_variant):
    ours, ref = pre_variant
    for text in CORPUS + _fuzz_texts(1, 500):
        for parse_special in (False, True):
            expected = _ref_encode(ref, text, True, parse_special)
            assert ours.encode(text, True, parse_special) == expected, repr(text)


def test_special_ids_match_llama_cpp(tok, ref):
    llama_cpp = pytest.importorskip("llama_cpp")
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    assert tok.n_vocab == n
    assert tok.bos_id == llama_cpp.llama_vocab_bos(vocab)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(vocab)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab)
    assert tok.eog_ids == {i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert {tok.token_text(i) for i in tok.eog_ids} >= {"<|im_end|>", "<|endoftext|>"}


def test_token_pieces_match_llama_cpp(tok, ref):
    import ctypes

    llama_cpp = pytest.importorskip("llama_cpp")
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    buf = ctypes.create_string_buffer(256)
    for i in range(tok.n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        assert tok.token_to_bytes(i) == buf.raw[:n], i
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, False)
        assert (b"" if tok.is_special(i) else tok.token_to_bytes(i)) == buf.raw[:n], i


# ---- round trips and decoding ----------------------------------------------------------------
def test_unencodable_bytes_are_exactly_the_missing_ones(tok):
    missing = {chr(b) for b in range(0x80) if BYTE_TO_CHAR[b] not in tok.vocab.token_to_id}
    assert missing == set(NO_TOKEN_CHARS)
    assert all(tok.encode(c, add_special=False) == [] for c in NO_TOKEN_CHARS)


_roundtrip_text = st.text(
    st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=NO_TOKEN_CHARS)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_roundtrip_text)
def test_decode_encode_roundtrip(tok, text):
    assert tok.decode(tok.encode(text, add_special=False, parse_special=False)) == text
    assert tok.decode(tok.encode(text, add_special=True, parse_special=True)) == text


def test_decode_special_tokens(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special=False)
    assert ids[0] == tok.vocab.token_to_id["<|im_start|>"]
    assert tok.is_special(ids[0]) and not tok.is_special(ids[1])
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    plain = tok.encode("<|im_start|>", add_special=False, parse_special=False)
    assert len(plain) > 1 and tok.decode(plain) == "<|im_start|>"


def test_bad_token_id_raises(tok):
    with pytest.raises(InvalidRequestError):
        tok.decode([tok.n_vocab])
    with pytest.raises(InvalidRequestError):
        tok.token_to_bytes(-1)


def _stream(tok, ids, skip_special=False):
    detok = IncrementalDetokenizer(tok, skip_special=skip_special)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    return detok, pieces


def _check_stream(tok, ids, skip_special=False):
    full = tok.decode(ids, skip_special=skip_special)
    detok, pieces = _stream(tok, ids, skip_special)
    so_far = ""
    for piece in pieces:
        piece.encode("utf-8")  # raises on a lone surrogate
        so_far += piece
        assert full.startswith(so_far)  # nothing emitted ever has to be taken back
    assert so_far == full == detok.text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=80))
def test_incremental_detokenizer_matches_decode(tok, text):
    ids = tok.encode(text, add_special=False)
    _check_stream(tok, ids)
    _check_stream(tok, ids, skip_special=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_incremental_detokenizer_on_arbitrary_ids(tok, data):
    # Byte tokens in random order make invalid and truncated UTF-8 sequences.
    byte_ids = [tok.vocab.token_to_id[c] for c in BYTE_TO_CHAR if c in tok.vocab.token_to_id]
    ids = data.draw(st.lists(st.sampled_from(byte_ids) | st.integers(0, tok.n_vocab - 1),
                             max_size=40))
    _check_stream(tok, ids)


def test_incremental_detokenizer_holds_partial_characters(tok):
    ids = tok.encode("😀", add_special=False)
    assert len(ids) > 1  # the emoji's 4 bytes are split over tokens
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.pending_bytes > 0
    assert detok.add(ids[-1]) == "😀" and detok.pending_bytes == 0
    lead = tok.vocab.token_to_id[BYTE_TO_CHAR[0xE6]]  # first byte of a 3-byte character
    assert detok.add(lead) == "" and detok.flush() == "\ufffd"


# ---- metadata errors -----------------------------------------------------------------------
def _tiny(**changes) -> dict:
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": [*BYTE_TO_CHAR, "ab", "<|s|>", "<|long|>", "<|lo"],
        "tokenizer.ggml.token_type": np.array([1] * 257 + [3, 3, 4], dtype=np.int32),
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 257,
        "tokenizer.ggml.eos_token_id": 257,
    }
    md.update(changes)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_vocab_specials_longest_first():
    tok = Tokenizer.from_gguf(_tiny())
    a, b = tok.vocab.token_to_id["a"], tok.vocab.token_to_id["b"]
    assert tok.encode("ab<|long|>a<|lo", add_special=False) == [256, 258, a, 259]
    assert tok.encode("b<|s|>", add_special=False, parse_special=False)[0] == b
    # user-defined tokens are split out even without parse_special, as in llama.cpp
    assert tok.encode("<|lo", add_special=False, parse_special=False) == [259]
    assert tok.eog_ids == {257} and not tok.add_bos


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "llama"}, "'llama'"),
        ({"tokenizer.ggml.model": "bert"}, "'bert'"),
        ({"tokenizer.ggml.pre": "fancy-new"}, "'fancy-new'"),
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": []}, "empty"),
        ({"tokenizer.ggml.tokens": [1, 2, 3]}, "strings"),
        ({"tokenizer.ggml.tokens": [*BYTE_TO_CHAR, "a"]}, "duplicate"),
        ({"tokenizer.ggml.token_type": np.array([1, 1])}, "token_type"),
        ({"tokenizer.ggml.token_type": np.zeros(300, dtype=np.float32)}, "token_type"),
        ({"tokenizer.ggml.merges": None}, "merges"),
        ({"tokenizer.ggml.merges": "a b"}, "merges"),
        ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token"),
        ({"tokenizer.ggml.bos_token_id": "1"}, "bos_token_id"),
        ({"tokenizer.ggml.tokens": list("abc"), "tokenizer.ggml.token_type": None,
          "tokenizer.ggml.bos_token_id": None, "tokenizer.ggml.add_bos_token": True}, "BOS"),
    ],
)
def test_bad_metadata_raises(changes, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_gguf(_tiny(**changes))


def test_missing_pre_uses_default_and_add_bos_defaults():
    tok = Tokenizer.from_gguf(_tiny(**{"tokenizer.ggml.pre": None}))
    assert tok.pre_tokenizer.spec.name == "default"
    tok = Tokenizer.from_gguf(_tiny(**{"tokenizer.ggml.pre": "llama3"}))
    assert tok.add_bos and tok.encode("ab")[0] == 257
    tok = Tokenizer.from_gguf(_tiny(**{"tokenizer.ggml.pre": "llama3",
                                      "tokenizer.ggml.add_bos_token": False}))
    assert not tok.add_bos
