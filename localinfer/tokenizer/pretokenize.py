"""Pre-tokenizers: split text into words before BPE as llama.cpp does per `tokenizer.ggml.pre`.

llama.cpp applies a list of regexes in turn; each one splits every piece left by the previous one
into its matches and the gaps between them. For the common GPT-2, Llama-3 and Qwen2 expressions it
runs hand-written matchers instead of a regex engine; the expressions below are written so that the
standard `re` module reproduces those matchers exactly. In particular the character classes use
llama.cpp's own Unicode tables (unicode_ranges.py) and whitespace set, not `re`'s `\\s` or `\\w`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from localinfer.tokenizer.unicode_ranges import LETTER, NUMBER, PUNCTUATION, parse_ranges

# llama.cpp's `\s` (unicode_set_whitespace); Python's `\s` would also match U+001C..U+001F.
_WHITESPACE = (
    [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A)]
    + [(0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
)


def _escape(cp: int) -> str:
    # Only ASCII punctuation, space and control characters can mean something inside a class
    # ("]", "\\", "-", "^", "[", "&&", ...): those are escaped, every other character goes in
    # as itself, which `re` parses several times faster than an escape (regex compilation
    # was 50 ms of every start with a byte-level BPE tokenizer).
    return f"\\x{cp:02x}" if cp < 0x80 and not chr(cp).isalnum() else chr(cp)


def _class_body(ranges: list[tuple[int, int]]) -> str:
    """The inside of a `[...]` class, with no character special."""
    parts = []
    for first, last in ranges:
        parts.append(_escape(first) if first == last else f"{_escape(first)}-{_escape(last)}")
    return "".join(parts)


@cache
def _classes() -> dict[str, str]:
    return {
        "L": _class_body(parse_ranges(LETTER)),
        "N": _class_body(parse_ranges(NUMBER)),
        "P": _class_body(parse_ranges(PUNCTUATION)),
        "W": _class_body(_WHITESPACE),
    }


# {L} letters, {N} numbers, {P} punctuation, {W} whitespace (class bodies, used inside [...]).
# `(?![^{W}])` is the regex `(?!\S)`: "not followed by a non-space" (end of piece counts).
_GPT2 = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+"
)
_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS_CI + r"|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{W}{L}{N}]+[\r\n]*"
    r"|[{W}]*[\r\n]+|[{W}]+(?![^{W}])|[{W}]+"
)
_QWEN2 = (
    _CONTRACTIONS_CI + r"|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{W}{L}{N}]+[\r\n]*"
    r"|[{W}]*[\r\n]+|[{W}]+(?![^{W}])|[{W}]+"
)
# llama.cpp's fallback list (LLAMA_VOCAB_PRE_TYPE_DEFAULT); the first regex's ASCII symbols are
# the ones its collapsed-category rewrite adds to \p{P}.
_DEFAULT = (
    r"[{P}$+<=>^~|]+",
    _GPT2,
    r"[{N}]+",
    r"[0-9][0-9][0-9]",
)


@dataclass(frozen=True, slots=True)
class PreTokenizerSpec:
    """How llama.cpp treats one family of `tokenizer.ggml.pre` values."""

    name: str
    patterns: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token skips the merges
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_SPECS = {
    "smollm": PreTokenizerSpec("smollm", (r"[{N}]", _GPT2)),
    "gpt2": PreTokenizerSpec("gpt2", (_GPT2,)),
    "qwen2": PreTokenizerSpec("qwen2", (_QWEN2,)),
    "llama3": PreTokenizerSpec("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizerSpec("dbrx", (_LLAMA3,)),
    "default": PreTokenizerSpec("default", _DEFAULT),
}

# tokenizer.ggml.pre value -> spec name (llama-vocab.cpp's table, for the families above)
_PRE_NAMES = {
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
         "mellum2"], "smollm"),
    **dict.fromkeys(
        ["gpt-2", "phi-2", "mpt", "olmo", "jais", "gigachat", "a.x-4.0", "mellum", "exaone4",
         "trillion", "granite-docling"], "gpt2"),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
         "solar-open"], "qwen2"),
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano"], "llama3"),
    **dict.fromkeys(["dbrx", "smaug-bpe"], "dbrx"),
    "default": "default",
    "": "default",  # a missing pre-tokenizer: llama.cpp warns and uses the default list
}


def pre_tokenizer_spec(pre: str) -> PreTokenizerSpec | None:
    """The spec for a `tokenizer.ggml.pre` value, or None when it is not supported."""
    key = _PRE_NAMES.get(pre)
    return _SPECS[key] if key is not None else None


def spec_named(name: str) -> PreTokenizerSpec | None:
    """The spec whose `name` this is (how the tokenizer cache stores the one in use)."""
    return _SPECS.get(name)


def supported_pre_tokenizers() -> list[str]:
    return sorted(name for name in _PRE_NAMES if name)


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.format(**_classes()))


class PreTokenizer:
    """Splits a text fragment into the words BPE merges within."""

    def __init__(self, spec: PreTokenizerSpec) -> None:
        self.spec = spec
        self._regexes = [_compile(p) for p in spec.patterns]

    def split(self, text: str) -> list[str]:
        spans = [(0, len(text))] if text else []
        for regex in self._regexes:
            spans = _split_spans(regex, text, spans)
        return [text[a:b] for a, b in spans]


def _split_spans(
    regex: re.Pattern[str], text: str, spans: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in spans:
        pos = start
        # endpos makes the piece end look like the end of the string to lookaheads, as in
        # llama.cpp, where each piece is matched on its own.
        for m in regex.finditer(text, start, end):
            a, b = m.span()
            if a > pos:
                out.append((pos, a))
            if b > a:
                out.append((a, b))
            pos = b
        if pos < end:
            out.append((pos, end))
    return out
