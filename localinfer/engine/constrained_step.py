"""ConstrainedStep: the structured-output part of an engine step.

    guided, first = constrained.start(batch)     # which sequences sample under a grammar;
                                                 # their masks fill (usually prefetched)
    logits = runner.execute(batch)
    constrained.apply(rows, sample_seqs, logits, speculating, first)  # disallowed -> -inf
    ... sample, verify, scheduler.postprocess ...
    errors = constrained.advance(updated, ...)   # matchers take the new tokens; the next
                                                 # step's masks start filling

Every constrained sequence gets a full mask, greedy ones too: a check of the unconstrained
argmax alone (validate_tokens) accepts any byte-valid token, while the mask keeps only
canonical tokenizations where the grammar forces bytes ("{" is refused where '{"' is
forced), and a model fed non-canonical tokens drifts (measured: SmolLM2 then looped). A
speculating sequence gets one mask per verified row: row j under the grammar's state after
its first j guesses (Guide.fill_masks), so verification accepts only what plain constrained
decoding could have sampled.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.scheduler import Scheduler
from localinfer.engine.sequence import Sequence, SequenceStatus
from localinfer.structured.guide import GuideFactory


class ConstrainedStep:
    def __init__(self, scheduler: Scheduler, guides: GuideFactory, runner_threads: int) -> None:
        self.scheduler = scheduler
        self.guides = guides
        self.runner_threads = runner_threads
        self.masker: Any = None  # structured.masks.Masker, made for the first constrained step
        self.active = False  # a constrained request was ever added: steps look for them

    def start(self, batch: ScheduledBatch) -> tuple[list[Sequence], dict[int, int]]:
        """The constrained sequences that sample a token this step, and the index of each one's
        first mask (seq_id -> index; a speculating one has one more per guess); their masks
        start filling unless the previous step prefetched them."""
        if not self.active:
            return [], {}
        guided = []
        for i, seq_id in enumerate(batch.seq_ids):
            seq = self.scheduler.seqs.get(seq_id)
            if seq is not None and seq.guide is not None and (
                    batch.context_lens[i] == seq.num_tokens + len(seq.spec_token_ids)):
                guided.append(seq)
        if not guided:
            return [], {}
        if self.masker is None:
            from localinfer.structured.masks import Masker

            self.masker = Masker(self.guides.ll_tokenizer.vocab_size, self.runner_threads)
        first, at = {}, 0
        for seq in guided:
            first[seq.seq_id] = at
            at += 1 + len(seq.spec_token_ids)
        self.masker.start([seq.guide for seq in guided],
                          tuple((s.seq_id, tuple(s.spec_token_ids)) for s in guided),
                          [seq.spec_token_ids for seq in guided])
        return guided, first

    def apply(self, rows: np.ndarray, sample_seqs: list[Sequence], logits: np.ndarray,
              speculating: list[tuple[Sequence, list[int]]], first: dict[int, int]) -> float:
        """Mask the sampling rows (rows[i] for sample_seqs[i]) and the speculating sequences'
        rows (in logits itself); the seconds it took."""
        if not first:
            return 0.0
        t0 = time.perf_counter()
        self.masker.apply(rows, [(i, first[seq.seq_id]) for i, seq in
                                 enumerate(sample_seqs) if seq.seq_id in first])
        self.masker.apply(logits, [(r, first[seq.seq_id] + j) for seq, spec_rows in speculating
                                   if seq.seq_id in first for j, r in enumerate(spec_rows)])
        return time.perf_counter() - t0

    def advance(self, updated: list[tuple[Sequence, list[int]]], n_guided: int,
                mask_s: float) -> dict[int, str]:
        """Feed each constrained sequence's new tokens to its matcher: a complete grammar
        finishes the sequence ("stop"); a matcher error ends it alone (returned by seq_id).
        Then the next step's masks start filling."""
        t0 = time.perf_counter()
        errors: dict[int, str] = {}
        for seq, new_tokens in updated:
            guide = seq.guide
            if guide is None:
                continue
            # every new token but one that finished the sequence (EOG, a stop, the length):
            # a speculating sequence's accepted guesses and its sampled token; masked rows
            # never let a guess past a complete grammar
            taken = new_tokens[:-1] if seq.is_finished else new_tokens
            # a matcher in an error state allows only EOG: that "stop" is a failure, not an end
            if guide.error or not all(guide.consume(t) for t in taken):
                errors[seq.seq_id] = f"structured output failed: {guide.error or 'refused'}"
                self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)
            elif not seq.is_finished and guide.is_stopped:
                self.scheduler.finish_stopped(seq)
        self._prefetch()
        self.masker.stats.record(n_guided, mask_s + time.perf_counter() - t0)
        return errors

    def _prefetch(self) -> None:
        """Start the next step's masks for the constrained sequences that will decode, in the
        order the scheduler puts them (running decodes first); guesses are not known yet, so
        a step that makes some fills anew."""
        nxt = [s for s in self.scheduler.running
               if s.guide is not None and s.num_uncomputed_tokens == 1]
        if nxt:
            self.masker.start([s.guide for s in nxt], tuple((s.seq_id, ()) for s in nxt))
