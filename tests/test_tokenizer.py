"""Tokenizer: token-for-token parity with llama.cpp, round trips, streaming decode, bad metadata."""

from __future__ import annotations

import os
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


# ---- the tokenizer cache -------------------------------------------------------------------
def assert_same_tokenizer(a: Tokenizer, b: Tokenizer, texts: list[str]) -> None:
    """b behaves exactly as a: the same vocabulary and special tokens, the same ids for every
    text and flag combination, the same pieces and decoded text."""
    assert type(a) is type(b)
    assert (a.n_vocab, a.bos_id, a.eos_id, a.eog_ids, a.add_bos, a.add_eos) == \
        (b.n_vocab, b.bos_id, b.eos_id, b.eog_ids, b.add_bos, b.add_eos)
    va, vb = a.vocab, b.vocab
    assert va.tokens == vb.tokens and va.attrs == vb.attrs and va.ids == vb.ids
    assert va.token_to_id == vb.token_to_id
    for flag in (False, True):
        assert va.special_tokens(flag) == vb.special_tokens(flag)
    for attr in ("_ranks", "_scores", "add_space_prefix"):  # BPE ranks / SPM scores
        assert getattr(a, attr, None) == getattr(b, attr, None), attr
    if hasattr(a, "pre_tokenizer"):
        assert a.pre_tokenizer.spec == b.pre_tokenizer.spec  # type: ignore[attr-defined]
    for text in texts:
        for add_special, parse_special in ((True, True), (False, False), (True, False)):
            ids = a.encode(text, add_special, parse_special)
            assert b.encode(text, add_special, parse_special) == ids, repr(text)
            for skip in (False, True):
                assert b.decode(ids, skip) == a.decode(ids, skip)
    every = list(range(a.n_vocab))
    assert [b.token_to_bytes(i) for i in every] == [a.token_to_bytes(i) for i in every]
    assert [b.is_special(i) for i in every] == [a.is_special(i) for i in every]


@pytest.fixture
def tok_cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALINFER_TOKENIZER_CACHE", raising=False)
    return tmp_path / "home" / "tokenizers"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.ltc")) if folder.is_dir() else []


def _tiny_spm_gguf(path: Path, extra: str = "▁ba") -> Path:
    """A SentencePiece ("llama") vocabulary, no tensors: specials, byte tokens, pieces with
    scores, an empty token (renamed by llama.cpp), invalid UTF-8 and a user-defined token."""
    from gguf_factory import VT, build_gguf

    pieces = ["▁", "a", "b", "▁a", "ab", "▁ab", "<start_of_turn>", "", b"\xff\xfe", extra]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * 6 + [4, 1, 1, 1]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.5, -1.5, -1.25, -0.5, 0.0, 0.0, -9.0, -3.0]
    path.write_bytes(build_gguf([
        ("general.architecture", VT.STRING, "gemma3"),
        ("tokenizer.ggml.model", VT.STRING, "llama"),
        ("tokenizer.ggml.tokens", VT.ARRAY, tokens, VT.STRING),
        ("tokenizer.ggml.scores", VT.ARRAY, scores, VT.FLOAT32),
        ("tokenizer.ggml.token_type", VT.ARRAY, types, VT.INT32),
        ("tokenizer.ggml.bos_token_id", VT.UINT32, 1),
        ("tokenizer.ggml.eos_token_id", VT.UINT32, 2),
    ]))
    return path


TINY_TEXTS = [*CORPUS, "ab ba aab <start_of_turn>ab<s></s>", " ▁a b", "\xff", "<|im_start|>x"]


def _load_twice(path: Path) -> tuple[Tokenizer, Tokenizer]:
    """(the tokenizer built on a miss, the one read back from the entry just written)."""
    from localinfer.tokenizer.cache import load_tokenizer

    with open_gguf(path) as g:
        return load_tokenizer(g), load_tokenizer(g)


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_cached_tiny_tokenizer_is_identical(tmp_path: Path, tok_cache: Path, kind: str,
                                            monkeypatch) -> None:
    from gguf_factory import write_tiny_llama

    path = write_tiny_llama(tmp_path / "m.gguf") if kind == "bpe" else \
        _tiny_spm_gguf(tmp_path / "m.gguf")
    with open_gguf(path) as g:
        fresh = Tokenizer.from_gguf(g.metadata)
    built, _ = _load_twice(path)
    assert len(_entries(tok_cache)) == 1
    # the second load must come from the entry: building is no longer possible
    monkeypatch.setattr(Tokenizer, "from_gguf", staticmethod(lambda md: pytest.fail("built")))
    _, cached = _load_twice(path)
    assert_same_tokenizer(fresh, built, TINY_TEXTS)
    assert_same_tokenizer(fresh, cached, TINY_TEXTS)
    if kind == "spm":
        assert cached.token_text(cached.n_vocab - 3) == "[EMPTY_266]"
        assert cached.token_text(cached.n_vocab - 2).encode("utf-8", "surrogateescape") == \
            b"\xff\xfe"  # the file's bytes, kept through the entry
        # scores stay 8 bytes a token, built or cached (a list of Python floats was 32: 6 MB
        # more for gemma3's 262k tokens); the same values as the file's float32 scores
        for tok in (built, cached):
            scores = tok._scores  # type: ignore[attr-defined]
            assert memoryview(scores).itemsize == 8 and len(scores) == tok.n_vocab
            assert scores[-1] == -3.0 and scores[-9] == -2.0


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "garbage", "empty", "state"])
def test_a_damaged_entry_is_rebuilt(tmp_path: Path, tok_cache: Path, damage: str) -> None:
    from gguf_factory import write_tiny_llama

    from localinfer.tokenizer import cache

    path = write_tiny_llama(tmp_path / "m.gguf")
    fresh, _ = _load_twice(path)
    (entry,) = _entries(tok_cache)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[:len(data) // 2])
    elif damage == "flip":  # a bit flipped inside the payload: the checksum catches it
        entry.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif damage == "magic":
        entry.write_bytes(b"X" + data[1:])
    elif damage == "garbage":
        entry.write_bytes(bytes(range(256)) * 40)
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a well-formed entry whose state does not describe a tokenizer
        import marshal

        entry_data = marshal.loads(data[12:])
        entry_data["state"]["attrs"] = entry_data["state"]["attrs"][:-1]
        cache.write_entry(entry, entry_data["key"], entry_data["state"])
    key = marshal_key(entry)
    assert cache.read_entry(entry, key) is None
    _, again = _load_twice(path)  # the first of these rebuilds and rewrites the entry
    assert_same_tokenizer(fresh, again, TINY_TEXTS)
    assert cache.read_entry(entry, key) is not None and _entries(tok_cache) == [entry]


def marshal_key(entry: Path) -> dict:
    """The key an entry for this file must carry (from its name: metadata digest, version)."""
    from localinfer.tokenizer import cache

    digest, version, _ = entry.name.split(".")
    return {"format": cache.FORMAT, "metadata_sha256": digest, "version": version}


def test_cache_off_with_env(tmp_path: Path, tok_cache: Path, monkeypatch) -> None:
    from gguf_factory import write_tiny_llama

    monkeypatch.setenv("LOCALINFER_TOKENIZER_CACHE", "0")
    a, b = _load_twice(write_tiny_llama(tmp_path / "m.gguf"))
    assert a is not b and not tok_cache.exists()
    assert a.encode("hello world") == b.encode("hello world")


def test_changed_metadata_misses(tmp_path: Path, tok_cache: Path) -> None:
    path = _tiny_spm_gguf(tmp_path / "m.gguf")
    old, _ = _load_twice(path)
    _tiny_spm_gguf(path, extra="▁bb")  # one token changed, same path and size
    new, cached = _load_twice(path)
    assert old.token_text(old.n_vocab - 1) == "▁ba"
    assert new.token_text(new.n_vocab - 1) == cached.token_text(new.n_vocab - 1) == "▁bb"
    assert len(_entries(tok_cache)) == 2  # one per metadata; the old one ages out


def test_same_metadata_other_weights_share_the_entry(tmp_path: Path, tok_cache: Path) -> None:
    from gguf_factory import write_tiny_llama

    a, _ = _load_twice(write_tiny_llama(tmp_path / "a.gguf", seed=1))
    b, _ = _load_twice(write_tiny_llama(tmp_path / "b.gguf", seed=2))
    assert len(_entries(tok_cache)) == 1 and a.encode("hello") == b.encode("hello")


def test_other_versions_and_the_least_recently_used_go(tmp_path: Path, tok_cache: Path,
                                                       monkeypatch) -> None:
    from localinfer.tokenizer import cache

    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    a, b, c = (_tiny_spm_gguf(tmp_path / f"{x}.gguf", extra=f"▁x{x}") for x in "abc")
    with open_gguf(a) as g:
        digest = g.metadata_sha256()
    tok_cache.mkdir(parents=True)
    older = tok_cache / f"{digest}.0123456789abcdef.ltc"  # the same metadata, older code
    older.write_bytes(b"an entry of another version")
    _load_twice(a)
    (entry_a,) = _entries(tok_cache)
    assert not older.exists()
    _load_twice(b)
    (entry_b,) = set(_entries(tok_cache)) - {entry_a}
    os.utime(entry_a, (1, 1))
    os.utime(entry_b, (2, 2))
    _load_twice(a)  # a hit: a is now the most recently used
    _load_twice(c)
    assert entry_a.exists() and not entry_b.exists() and len(_entries(tok_cache)) == 2


def test_rm_drops_the_models_entries(tmp_path: Path, tok_cache: Path) -> None:
    from gguf_factory import write_tiny_llama

    from localinfer.catalog import Catalog, CatalogEntry

    cat = Catalog({"tiny": CatalogEntry("tiny", "m.gguf", "0" * 64, {})}, "tiny",
                  tmp_path / "models")
    path = cat.path_of(cat.get("tiny"))
    path.parent.mkdir(parents=True)
    _load_twice(write_tiny_llama(path))
    other = _tiny_spm_gguf(tmp_path / "other.gguf")
    _load_twice(other)
    assert len(_entries(tok_cache)) == 2
    assert cat.remove("tiny") and not path.exists()
    (left,) = _entries(tok_cache)
    with open_gguf(other) as g:
        assert left.name.startswith(g.metadata_sha256())


def test_state_round_trip_when_tokens_hold_the_separators():
    from localinfer.tokenizer.state import from_state, to_state

    tokens = [*BYTE_TO_CHAR, "ab", "<|s|>", "<|long|>", "<|lo"]
    tokens[-1] = "<|\x00\x1f|>"  # a user-defined token holding the first two separators
    tok = Tokenizer.from_gguf(_tiny(**{"tokenizer.ggml.tokens": tokens,
                                       "tokenizer.ggml.merges": ["a b", "a b", "ab"]}))
    assert tok._ranks == {"a b": 0, "ab": 2}  # a repeated merge keeps its first rank
    state = to_state(tok)
    assert state["tokens"][0] == "\ufdd0"
    again = from_state(state)
    assert_same_tokenizer(tok, again, [*TINY_TEXTS, "x<|\x00\x1f|>ab"])
    for broken in ({**state, "model": "wordpiece"}, {**state, "eog": b"\xff\xff\xff\x7f"},
                   {**state, "tokens": ("\x00", "a\x00b", 3)}, {**state, "ids": {}}, []):
        with pytest.raises(ValueError):
            from_state(broken)
