"""Proposer: guesses the tokens that follow a sequence, for the target model to verify.

One call per step covers every speculating sequence of the step, so a proposer that runs a
model (a draft: a smaller model with the same vocabulary, in the same process, with KV blocks
of its own) proposes for all of them in one batch. Its state past what the target accepted
is dropped through `accepted`, and everything it keeps for a sequence through `free`.

Proposals may be shorter than asked, or empty (nothing worth guessing): the sequence then
decodes one token as usual. A proposer's guesses are treated as certain (q one-hot) by the
verifier (verifier.py), so one that samples its guesses must not be added without also
passing its distribution there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from localinfer.engine.sequence import Sequence
from localinfer.errors import InvalidRequestError


class Proposer(ABC):
    name: str = "abstract"
    # its calls run forward passes (a draft model): a call that returns no guess still cost
    # them, and counts as a round that accepted nothing (on the 1.5B's story a third of the
    # 0.5B's calls found no guess it was sure of, each a third of a target step). An n-gram
    # lookup that finds nothing costs microseconds and looks again next step.
    runs_a_model: bool = False

    @abstractmethod
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ks[i] guesses of the tokens after seqs[i].token_ids, for each sequence."""

    def accepted(self, seq: Sequence, proposed: int, accepted: int) -> None:  # noqa: B027
        """Verification kept the first `accepted` of the sequence's `proposed` guesses; its
        tokens are now seq.token_ids. A proposer with state past them (a draft's KV) drops it."""

    def free(self, seq: Sequence) -> None:  # noqa: B027
        """The sequence finished or was preempted: release what is kept for it."""

    def close(self) -> None:  # noqa: B027
        """Release what the proposer holds (a draft's weights and KV pool)."""


def make_proposer(spec: str, runner: Any = None, tokenizer: Any = None,
                  max_model_len: int = 4096, max_num_seqs: int = 16,
                  backend_options: dict[str, Any] | None = None) -> Proposer:
    """The proposer a `speculative` setting names: "ngram", else a draft model (a catalog
    name or a .gguf path) loaded on the target runner's backend with the target's
    backend_options (engine/draft_proposer.py)."""
    if spec == "ngram":
        from localinfer.engine.ngram_proposer import NgramProposer

        return NgramProposer()
    if not spec.strip():
        raise InvalidRequestError("invalid speculative '': 'ngram' or a draft MODEL")
    if runner is None:
        raise InvalidRequestError(f"a draft model ({spec}) needs the target model's runner")
    from localinfer.engine.draft_proposer import load_draft

    return load_draft(spec, runner, tokenizer, max_model_len, max_num_seqs,
                      backend_options=backend_options)
