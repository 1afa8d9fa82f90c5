"""Speculator: which decoding sequences guess how many tokens in a step, and the tally.

A guess is a token the step computes for the sequence beyond its last one; it pays only when
the step costs hardly more for it. On a CPU a decode step is bound by reading the weights,
so a few more tokens ride along almost free while the batch is small (measured on
Qwen2.5-Coder-0.5B, 2 cores, logits at every position: a step of 4 tokens costs 1.2x one of
1 token, 9 tokens 1.8x, 32 tokens 4x); once many sequences decode together the step is bound
by compute and every guessed token costs about what a real one does, so a rejected guess is a
loss. The rules, applied after the scheduler has placed every decode and prefill chunk
(guesses never displace them):

- no guesses in a step with more than `max_decodes` decoding sequences (default 4, so at 16
  concurrent streams speculation never runs and never lowers throughput);
- guesses take only the step's leftover token budget and free KV blocks, and never preempt;
- a sequence guesses at most its AdaptiveK's k (adaptive_k.py: rounded to the runner's token
  groups for a cheap proposer), at most what max_tokens and
  the context leave after the token it samples anyway;
- a sequence stops guessing for a while once its verifications keep accepting fewer tokens
  than they cost (adaptive_k.py): the proposer's time is measured per call and weighed
  against the target's decode step, so a draft model that disagrees too often is paused as an
  n-gram lookup that misses is; a draft's call that found no guess sure enough counts as a
  round that accepted nothing;
- a constrained sequence (structured output) keeps only the guesses its grammar accepts in a
  row (Guide.valid_prefix): a guess the grammar refuses could never be verified, and the
  ones after it would be computed for nothing.
"""

from __future__ import annotations

import time

from localinfer.engine.adaptive_k import VERIFY_COST, AdaptiveK
from localinfer.engine.proposer import Proposer
from localinfer.engine.sequence import Sequence

DEFAULT_MAX_DECODES = 4


class Speculator:
    def __init__(self, proposer: Proposer, num_speculative_tokens: int,
                 max_decodes: int = DEFAULT_MAX_DECODES, token_group: int = 1) -> None:
        self.proposer = proposer
        self.max_k = num_speculative_tokens
        self.token_group = token_group  # the runner's (ModelRunner.token_group)
        self.max_decodes = max_decodes
        self.proposed_tokens = 0
        self.accepted_tokens = 0
        self.verifications = 0
        # seconds of a decode step of the target (a moving average, None before the first):
        # what a guess's share of the proposer's time is weighed against
        self.step_seconds: float | None = None
        # what a guessed position adds to a step, in plain steps: VERIFY_COST until steps
        # with and without guesses have both been timed, then measured (a moving average)
        self.guess_cost = VERIFY_COST
        self._plain_timed = False
        self._proposer_seconds: dict[int, float] = {}  # seq_id -> its share of the last call

    def propose(self, decodes: list[Sequence], budget: int,
                max_model_len: int) -> list[tuple[Sequence, list[int]]]:
        """Guesses for this step's decoding sequences within `budget` tokens (each guess list
        may still be cut to the blocks the scheduler finds free)."""
        if not decodes or len(decodes) > self.max_decodes:
            return []
        seqs: list[Sequence] = []
        ks: list[int] = []
        for seq in decodes:
            if budget < 1:
                break
            if seq.adaptive_k is None:
                seq.adaptive_k = AdaptiveK(self.max_k, dear=self.proposer.runs_a_model,
                                           group=self.token_group)
            params = seq.sampling_params
            k = min(seq.adaptive_k.want(), budget,
                    params.max_tokens - seq.num_output_tokens - 1,
                    max_model_len - seq.num_tokens - 1)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
                budget -= k
        if not seqs:
            return []
        t0 = time.perf_counter()
        guesses = self.proposer.propose(seqs, ks)
        share = (time.perf_counter() - t0) / len(seqs)  # a draft's passes serve all of them
        out = []
        for seq, g in zip(seqs, guesses, strict=True):
            if g and seq.guide is not None:
                g = g[: seq.guide.valid_prefix(g)]
            if g:
                out.append((seq, g))
                self._proposer_seconds[seq.seq_id] = share
            elif self.proposer.runs_a_model:
                # nothing to verify, but a draft's pass is spent (no guess was sure enough):
                # a round that accepted nothing
                self._weigh(seq, 0, 0, share)
        return out

    def observe_step(self, seconds: float, guessed: int = 0, n_seqs: int = 1) -> None:
        """A step in which `n_seqs` sequences each decoded one token, plus `guessed` guessed
        positions among them, took `seconds`. Steps without guesses time a plain step; once
        one has, steps with guesses time what a guess adds (the 1.5B verifying the 0.5B's
        guesses: 0.07-0.15 of a step over a story, noisy from step to step, hence the moving
        average); before that a step with guesses stands for a plain one with the model's
        VERIFY_COST taken out."""
        s = self.step_seconds
        if guessed == 0:
            self.step_seconds = seconds if s is None or not self._plain_timed else (
                0.8 * s + 0.2 * seconds)
            self._plain_timed = True
        elif self._plain_timed and s is not None:
            per_guess = max(seconds - s, 0.0) / s * n_seqs / guessed
            self.guess_cost = 0.8 * self.guess_cost + 0.2 * per_guess
        else:
            plain = seconds / (1.0 + VERIFY_COST * guessed / n_seqs)
            self.step_seconds = plain if s is None else 0.8 * s + 0.2 * plain

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """A verification of the sequence's guesses accepted the first `accepted`."""
        self.verifications += 1
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted
        self._weigh(seq, proposed, accepted, self._proposer_seconds.pop(seq.seq_id, 0.0))
        self.proposer.accepted(seq, proposed, accepted)

    def _weigh(self, seq: Sequence, proposed: int, accepted: int, spent: float) -> None:
        """The sequence's AdaptiveK learns what the round gained against what it cost."""
        if seq.adaptive_k is None:
            return
        # a first proposal includes a draft's prefill of the prompt, paid once: not weighed
        # against what its first guesses gained
        first = seq.adaptive_k.verifications == 0
        steps = spent / self.step_seconds if self.step_seconds and not first else 0.0
        seq.adaptive_k.record(proposed, accepted, steps, self.guess_cost)

    def free(self, seq: Sequence) -> None:
        seq.spec_token_ids = []
        self._proposer_seconds.pop(seq.seq_id, None)
        self.proposer.free(seq)
