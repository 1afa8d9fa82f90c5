"""Continuations: the exact token ids of recent requests, so that a chat's next turn reuses them.

A chat client resends the whole conversation each turn. Re-tokenizing the earlier replies often
gives other ids than the model generated (a word the model spelled in two tokens comes back as
one), and the prefix cache — which matches ids — then misses everything after the first such
place (seen: turn 2 of a chat found 64 of 258 tokens cached; the reply had 197). So the engine
remembers each finished request's prompt + generated ids with the text they decode to, and a new
chat prompt whose rendered text starts with one of those texts keeps its ids and tokenizes only
the rest. It matches by text, so it works for clients that send only text (the server's).

A splice is taken only at a clean boundary: the remembered ids end with a special token (the
reply's end-of-turn), or the rest of the prompt begins with one (a reply cut by max_tokens, then
the template's end-of-turn). Mid-text boundaries would feed the model a tokenization it never
produces; stop strings cut the reply's text, so the longer remembered text no longer matches.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from localinfer.tokenizer import Tokenizer

CAPACITY = 64  # recent requests remembered (text + ids each)
MIN_CHARS = 16  # shorter matches save nothing worth a lookup


class Continuations:
    def __init__(self, tokenizer: Tokenizer, capacity: int = CAPACITY) -> None:
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._entries: OrderedDict[str, list[int]] = OrderedDict()  # text -> ids, oldest first
        self._lock = threading.Lock()
        specials = tokenizer.vocab.special_tokens(True)
        self._special_texts = tuple(text for text, _ in specials if text)

    def remember(self, ids: list[int]) -> None:
        """A finished request's prompt + generated ids."""
        body = ids[1:] if ids and ids[0] == self.tokenizer.bos_id and self.tokenizer.add_bos \
            else ids
        if not body:
            return
        text = self.tokenizer.decode(body)
        if len(text) < MIN_CHARS:
            return
        with self._lock:
            self._entries[text] = list(ids)
            self._entries.move_to_end(text)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def splice(self, text: str) -> list[int] | None:
        """Ids for the rendered prompt `text` that start with the longest remembered request
        it continues, or None (the caller tokenizes the whole text)."""
        with self._lock:
            candidates = [(t, ids) for t, ids in self._entries.items()
                          if len(t) < len(text) and text.startswith(t)]
        for t, ids in sorted(candidates, key=lambda c: len(c[0]), reverse=True):
            rest = text[len(t):]
            if self.tokenizer.is_special(ids[-1]) or rest.startswith(self._special_texts):
                with self._lock:
                    if t in self._entries:
                        self._entries.move_to_end(t)
                return ids + self.tokenizer.encode(rest, add_special=False, parse_special=True)
        return None
