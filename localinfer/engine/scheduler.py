"""Scheduler: continuous batching with chunked prefill under a token and a KV-block budget.

Each step: running sequences that decode (one token each) first, then prefill chunks of
running sequences whose prompt is partly computed, then waiting sequences in arrival order.
A waiting sequence is admitted only when blocks for all its tokens are free (minus what the
prefix cache already holds); a decode that needs a new block and finds none preempts the
newest running sequence by recompute.  Models with sliding-window layers also draw on a
second, smaller pool (sliding_window.py): a chunk is shrunk to its free blocks, admission
waits for them, and a sequence that cannot advance by one token preempts the newest.

Speculative decoding (speculator.py): once the step is filled, decoding sequences may add
guessed tokens from the leftover budget and free blocks; postprocess appends what the
verifier accepted, cut at the first token that finishes the sequence, and rolls the rejected
guesses' K/V back (their blocks return to the pool, the runner forgets their positions).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.block_manager import BlockManager
from localinfer.engine.config import EngineConfig
from localinfer.engine.sequence import Sequence, SequenceStatus
from localinfer.engine.sliding_window import SlidingWindowPool
from localinfer.engine.speculator import Speculator


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        eog_token_ids: Iterable[int] = (),
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        # tokens a sequence may reach: the context length, or the pool if that is smaller
        self.max_model_len = min(config.max_model_len, block_manager.num_blocks * self.block_size)
        self.eog_token_ids = frozenset(eog_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the newest is last
        self.seqs: dict[int, Sequence] = {}  # every unfinished sequence by id
        self.num_preemptions = 0
        # most sequences admitted at once, where the runner's KV layout limits it (None: no
        # limit beyond max_num_seqs per step)
        self.max_running: int | None = None
        # the sliding-window layers' own KV pool, when the model has such layers (LLMEngine)
        self.sliding: SlidingWindowPool | None = None
        # proposes speculative guesses when the engine speculates (LLMEngine)
        self.speculator: Speculator | None = None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens (or a preempted sequence's tokens) still to compute: a decoding
        sequence has one uncomputed token, its last; anything more is prefill work."""
        return sum(n for seq in self.seqs.values() if (n := seq.num_uncomputed_tokens) > 1)

    def schedule(self) -> ScheduledBatch | None:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        num_preemptions = self.num_preemptions
        for seq in decodes:
            if budget < 1 or len(scheduled) >= self.config.max_num_seqs:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if not self._make_room(seq, scheduled):
                continue  # it preempted itself
            self.block_manager.may_append(seq)
            if self.sliding is not None:
                self.sliding.ensure(seq, seq.num_tokens)
            scheduled.append((seq, 1))
            budget -= 1
        for seq in prefills:
            if budget < 1 or len(scheduled) >= self.config.max_num_seqs:
                break
            if seq.status is SequenceStatus.RUNNING:
                n = min(seq.num_uncomputed_tokens, budget)
                if self.sliding is not None:
                    n = self._fit_sliding(seq, n, scheduled)
                    if n == 0:
                        continue  # it preempted itself
                scheduled.append((seq, n))
                budget -= n
        # after a preemption the pool is tight: admitting now would only thrash
        admit = self.num_preemptions == num_preemptions
        while admit and self.waiting and budget >= 1 and len(scheduled) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.max_running is not None and len(self.running) >= self.max_running:
                break
            if not self.block_manager.can_allocate(seq):
                break  # first come, first served: later requests wait too
            n = min(seq.num_uncomputed_tokens, budget)
            if self.sliding is not None and self.sliding.max_end(seq) < n:
                if self.running:
                    break  # the sliding pool frees blocks as running sequences advance
                n = self.sliding.max_end(seq)  # alone: a shorter first chunk
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.perf_counter()
            self.running.append(seq)
            n = min(n, seq.num_uncomputed_tokens)  # allocate() may have found a cached prefix
            if self.sliding is not None:
                self.sliding.ensure(seq, seq.num_computed_tokens + n)
            scheduled.append((seq, n))
            budget -= n
        if self.speculator is not None and budget >= 1:
            self._add_guesses(scheduled, budget)
        return self._build_batch(scheduled) if scheduled else None

    def _add_guesses(self, scheduled: list[tuple[Sequence, int]], budget: int) -> None:
        """Let the step's decoding sequences compute guessed tokens after their last one,
        within the leftover budget and the free blocks (never preempting for them)."""
        assert self.speculator is not None
        where = {seq.seq_id: i for i, (seq, n) in enumerate(scheduled)
                 if n == 1 and seq.num_uncomputed_tokens == 1}
        decodes = [scheduled[i][0] for i in where.values()]
        for seq, guesses in self.speculator.propose(decodes, budget, self.max_model_len):
            n = min(len(guesses), self.block_manager.lookahead_room(seq))
            if self.sliding is not None:
                n = min(n, self.sliding.max_end(seq) - seq.num_tokens)
            if n <= 0:
                continue
            self.block_manager.may_append(seq, n)
            if self.sliding is not None:
                self.sliding.ensure(seq, seq.num_tokens + n)
            seq.spec_token_ids = guesses[:n]
            scheduled[where[seq.seq_id]] = (seq, 1 + n)

    def _make_room(self, seq: Sequence, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Preempt the newest running sequences until seq can grow by its next token; False
        if seq itself was the one preempted."""
        def fits() -> bool:
            if not self.block_manager.can_append(seq):
                return False
            sliding = self.sliding
            return sliding is None or (sliding.blocks_needed(seq, seq.num_tokens)
                                       <= sliding.num_free_blocks)

        while not fits():
            if self._preempt_newest(seq, scheduled):
                return False
        return True

    def _fit_sliding(self, seq: Sequence, n: int, scheduled: list[tuple[Sequence, int]]) -> int:
        """Shrink a prefill chunk of n tokens to what the sliding pool can hold (preempting
        the newest sequences while not even one token fits) and take its blocks; 0 if seq
        itself was preempted."""
        assert self.sliding is not None
        while self.sliding.max_end(seq) <= seq.num_computed_tokens:
            if self._preempt_newest(seq, scheduled):
                return 0
        n = min(n, self.sliding.max_end(seq) - seq.num_computed_tokens)
        self.sliding.ensure(seq, seq.num_computed_tokens + n)
        return n

    def _preempt_newest(self, seq: Sequence, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Preempt the newest running sequence not already in this step (seq if none is
        newer); True if that was seq itself."""
        in_step = {s.seq_id for s, _ in scheduled}
        victim = next(s for s in reversed(self.running) if s is seq or s.seq_id not in in_step)
        self.preempt(victim)
        return victim is seq

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and put it at the front of the queue; everything it
        has (prompt and generated tokens) is recomputed when it is admitted again."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        if self.sliding is not None:
            self.sliding.free(seq)
        if self.speculator is not None:
            self.speculator.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        seq.prompt_logits_rows.clear()
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _build_batch(self, scheduled: list[tuple[Sequence, int]]) -> ScheduledBatch:
        bs = self.block_size
        batch = ScheduledBatch.empty(bs)
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            end = start + n
            flat0 = batch.num_tokens
            guesses = seq.spec_token_ids  # after the last token, when the sequence speculates
            batch.add_sequence(seq.seq_id, seq.token_ids[start:end] + guesses, start,
                               seq.block_table)
            if self.sliding is not None:
                swa = self.sliding.ensure(seq, end)
                batch.swa_block_tables.append(list(swa))
                batch.swa_slot_mapping.extend(swa[p // bs] * bs + p % bs
                                              for p in range(start, end))
            if seq.wants_prompt_rows and start < seq.num_prompt_tokens:
                last = min(end, seq.num_prompt_tokens)
                batch.logits_indices.extend(range(flat0, flat0 + last - start))
                if end == seq.num_tokens and end > last:
                    batch.logits_indices.append(flat0 + n - 1)
            elif end == seq.num_tokens + len(guesses):  # it reaches the last token: sample
                # from it, and verify each guess (the row before it says what it should be)
                batch.logits_indices.extend(range(flat0 + n - 1 - len(guesses), flat0 + n))
        return batch

    def postprocess(self, batch: ScheduledBatch,
                    sampled: dict[int, list[int]]) -> list[tuple[Sequence, list[int]]]:
        """Advance every scheduled sequence by its computed tokens and append its new tokens
        (seq_id -> the sampled token, or a verification's accepted guesses and the token
        after them), up to the first that finishes it; roll back the K/V of rejected
        guesses. Returns the sequences that got tokens, finished ones included, each with
        the tokens appended."""
        updated: list[tuple[Sequence, list[int]]] = []
        for i, seq_id in enumerate(batch.seq_ids):
            seq = self.seqs.get(seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            guesses, seq.spec_token_ids = seq.spec_token_ids, []
            tokens = sampled.get(seq_id, [])
            appended: list[int] = []
            status = None
            for token in tokens:
                seq.append_token(token)
                appended.append(token)
                status = self._check_stop(seq, token)
                if status is not None:
                    break  # tokens after it are never emitted, as in plain decoding
            computed = batch.context_lens[i]
            if guesses:
                assert self.speculator is not None
                accepted = len(tokens) - 1
                self.speculator.record(seq, len(guesses), accepted)
                # the last token's and the accepted guesses' K/V hold; the rest leave
                computed = min(computed - len(guesses) + accepted, seq.num_tokens - 1)
                if computed < batch.context_lens[i]:
                    self.block_manager.truncate(seq, computed)
                    if self.sliding is not None:
                        self.sliding.truncate(seq, computed)
            seq.num_computed_tokens = computed
            self.block_manager.cache_computed_blocks(seq)
            if self.sliding is not None:
                self.sliding.release_out_of_window(seq)
            if not appended:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            if status is not None:
                self.finish(seq, status)
            updated.append((seq, appended))
        return updated

    def _check_stop(self, seq: Sequence, token: int) -> SequenceStatus | None:
        params = seq.sampling_params
        if (token in self.eog_token_ids and not params.ignore_eos) or (
            token in params.stop_token_ids
        ):
            return SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End a sequence (stop, length or abort) and free its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
            if self.sliding is not None:
                self.sliding.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if self.speculator is not None:
            self.speculator.free(seq)
        seq.status = status
        seq.finished_time = time.perf_counter()
        self.seqs.pop(seq.seq_id, None)

    def finish_stopped(self, seq: Sequence) -> None:
        """A stop string matched (decided by the engine, which owns the text)."""
        self.finish(seq, SequenceStatus.FINISHED_STOPPED)

    def abort(self, seq_id: int) -> Sequence | None:
        seq = self.seqs.get(seq_id)
        if seq is not None:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seq
