"""Guide: one sequence's grammar matcher; GuideFactory compiles constraints once per model.

A grammar is compiled into an llguidance matcher the first time a request uses it (a few ms
for a typical schema; llguidance drops the GIL meanwhile), validated — an error or a schema
feature llguidance does not implement raises StructuredOutputError naming it — and kept as a
prototype; each sequence gets a copy of the prototype (microseconds). `prepare()` may run on any
thread: the server calls it on a worker thread while validating the request, so the engine
thread only ever copies.

The matcher's state is the sequence's output tokens, which preemption (recompute) never
changes: a preempted sequence keeps its matcher as it is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from localinfer.structured.spec import StructuredOutput, StructuredOutputError
from localinfer.structured.tokenizer import ll_tokenizer

if TYPE_CHECKING:
    from localinfer.tokenizer.base import Tokenizer

MAX_PROTOTYPES = 64


class Guide:
    """The matcher of one constrained sequence.

    The engine thread advances it and checks guesses against it while a mask worker
    (masks.py) may be filling its masks; `lock` keeps the two off the matcher at once."""

    __slots__ = ("matcher", "lock")

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.lock = threading.Lock()

    def consume(self, token_id: int) -> bool:
        """Advance by a sampled token; False if the grammar refused it (an error state)."""
        with self.lock:
            return bool(self.matcher.consume_token(token_id))

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` (speculative guesses) the grammar accepts in a row from here."""
        with self.lock:
            return int(self.matcher.validate_tokens(tokens))

    def fill_masks(self, ptr: int, size: int, guesses: list[int]) -> None:
        """len(guesses) + 1 masks of `size` bytes from address ptr on: the mask of the current
        state, then of the state after each guess, i.e. the mask each verified row of a
        speculating sequence is sampled under; the matcher is rolled back to where it was.
        The guesses passed valid_prefix, so every one is consumed."""
        with self.lock:
            m = self.matcher
            m.unsafe_compute_mask_ptr(ptr, size)
            taken = 0
            for j, token in enumerate(guesses):
                if not m.consume_token(token):
                    break
                taken += 1
                m.unsafe_compute_mask_ptr(ptr + (j + 1) * size, size)
            if taken:
                m.rollback(taken)

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete and can take no further token (EOS aside)."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self.matcher.get_error()) if self.matcher.is_error() else ""


class GuideFactory:
    """Compiled constraints of one model (its tokenizer), shared by all its requests."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._prototypes: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> Any:
        return ll_tokenizer(self.tokenizer)

    def warm_up(self) -> None:
        """Build llguidance's tokenizer and load the mask kernel now (any thread), so the first
        constrained request does not pay for them."""
        import numpy as np

        from localinfer.structured.apply_mask import apply_bitmasks

        _ = self.ll_tokenizer
        one = np.zeros(1, np.int64)
        apply_bitmasks(np.zeros((1, 32), np.float32), one, np.full((1, 1), -1, np.int32), one)

    def prepare(self, spec: StructuredOutput) -> Any:
        """The compiled prototype matcher of `spec`; raises StructuredOutputError."""
        grammar = spec.grammar_text()
        with self._lock:
            proto = self._prototypes.get(grammar)
            if proto is not None:
                self._prototypes.move_to_end(grammar)
                return proto
        proto = self._compile(spec, grammar)
        with self._lock:
            self._prototypes[grammar] = proto
            while len(self._prototypes) > MAX_PROTOTYPES:
                self._prototypes.popitem(last=False)
        return proto

    def guide(self, spec: StructuredOutput) -> Guide:
        return Guide(self.prepare(spec).deep_copy())

    def _compile(self, spec: StructuredOutput, grammar: str) -> Any:
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        problems = [matcher.get_error()] if matcher.is_error() else []
        # warnings are features llguidance would not enforce: never run those unconstrained
        problems += matcher.get_grammar_warnings()
        if problems:
            raise StructuredOutputError(f"invalid {spec.describe()}: {_first_line(problems)}")
        return matcher


def _first_line(messages: list[str]) -> str:
    """llguidance appends the grammar source under its message; keep the message."""
    text = "; ".join(m.strip() for m in messages if m.strip()) or "rejected by llguidance"
    lines = text.splitlines()
    head = lines[0]
    # a regex parse error puts the reason a few lines down ("error: ...")
    reason = next((ln.strip() for ln in lines[1:] if ln.strip().startswith("error:")), "")
    return f"{head} ({reason})" if reason and reason not in head else head
