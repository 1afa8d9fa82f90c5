"""llguidance's view of our vocabulary: every token's bytes, which ones are special, EOG ids.

llguidance computes a mask by walking a trie of token byte strings, so a byte wrong here lets
the model write text the grammar forbids, or forbids text it allows. Ordinary tokens are the
bytes they add to the text (byte-level BPE unmapped, SentencePiece's "▁" as a space, "<0xAB>"
byte tokens as that byte) — `Tokenizer.token_to_bytes`, the same bytes our detokenizer emits.
Special tokens (control and unknown tokens, and user-defined ones written like `<tag>`, as
llguidance's own llama.cpp glue does) get a 0xFF prefix: that byte never occurs in UTF-8, so
text can never produce them, and grammars name them as `<|im_end|>`. Unused tokens are empty.
Building this walks the whole vocabulary (~1 s for 151k tokens), so it is done once per
tokenizer and cached.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from localinfer.tokenizer.vocab import TokenAttr

if TYPE_CHECKING:
    from localinfer.tokenizer.base import Tokenizer

SPECIAL_PREFIX = b"\xff"
_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def is_special(tokenizer: Tokenizer, token_id: int) -> bool:
    attr = tokenizer.vocab.attrs[token_id]
    if attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
        return True
    text = tokenizer.vocab.tokens[token_id]
    return bool(attr & TokenAttr.USER_DEFINED) and text.startswith("<") and text.endswith(">")


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each token's bytes as llguidance sees them (special ones behind 0xFF)."""
    out: list[bytes] = []
    for i in range(tokenizer.n_vocab):
        if tokenizer.vocab.attrs[i] & TokenAttr.UNUSED:
            out.append(b"")
        elif is_special(tokenizer, i):
            out.append(SPECIAL_PREFIX + tokenizer.token_to_bytes(i))
        else:
            out.append(tokenizer.token_to_bytes(i))
    return out


class _Adapter:
    """The object llguidance.TokenizerWrapper wraps: attributes plus a tokenize callback."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens = token_bytes(tokenizer)
        self.special_token_ids = [i for i, b in enumerate(self.tokens)
                                  if b.startswith(SPECIAL_PREFIX)]
        self.eos_token_id = eog_ids(tokenizer)[0]
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: str | bytes) -> list[int]:
        # llguidance tokenizes forced text with this: plain text, no BOS, specials not parsed
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self.tokenizer.encode(text, add_special=False, parse_special=False)


def eog_ids(tokenizer: Tokenizer) -> list[int]:
    """The end-of-generation ids, EOS first: what a finished grammar allows next."""
    eog = sorted(tokenizer.eog_ids)
    if tokenizer.eos_id is not None and tokenizer.eos_id in eog:
        eog.remove(tokenizer.eos_id)
        eog.insert(0, tokenizer.eos_id)
    if not eog:
        raise ValueError("the vocabulary has no end-of-generation token")
    return eog


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The llguidance.LLTokenizer for this tokenizer, built on first use and cached."""
    with _lock:
        cached = _cache.get(tokenizer)
        if cached is None:
            import llguidance

            adapter = _Adapter(tokenizer)
            # JSON's slices: ~10% faster masks than the general ones on JSON Schemas and as
            # fast on free text (measured on Qwen's 151k vocabulary)
            cached = llguidance.LLTokenizer(llguidance.TokenizerWrapper(adapter),
                                            eos_token=eog_ids(tokenizer),
                                            slices=llguidance.LLTokenizer.json_slices())
            _cache[tokenizer] = cached
        return cached
