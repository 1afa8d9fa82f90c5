"""LLMEngine: requests in, streamed RequestOutputs out; one step = one forward pass.

    batch  = scheduler.schedule()              # which tokens of which sequences
    constrained.start(batch)                    # constrained sequences' token masks: filling
    logits = runner.execute(batch)              #   on a worker thread meanwhile
    constrained.apply(rows, ...)                # disallowed tokens -> -inf (constrained_step.py)
    tokens = sampler(logits, seqs)              # per-request sampling; speculating
                                                #   sequences: verify(rows, guesses)
    seqs   = scheduler.postprocess(batch, ...)  # append, finish, free blocks, roll back
    constrained.advance(...)                    # matchers take the tokens; a complete grammar
                                                #   finishes with "stop";
                                                # the next step's masks start filling now
    then text: incremental detokenization and stop strings

Structured output is the engine's, not the backend's: every runner returns plain logits and
the same masks apply to all of them. A sequence whose matcher fails (an llguidance resource
limit) ends alone, with the error in its last output; the others carry on.

Speculative decoding (config.speculative) is the scheduler's and the verifier's: a
speculating sequence's step returns one logits row per guess plus one, verify() turns them
into the accepted guesses and the next token, and the text of each is streamed as if it had
been decoded alone (a stop string inside the run cuts the rest off). A constrained
sequence's guesses are cut to what its grammar accepts before the step, and each of its
verified rows is masked by the grammar's state after the guesses before it.

Context policy: a prompt longer than the usable context (max_model_len, or the KV pool if
that is smaller) is rejected at add_request with ContextLengthExceededError. A prompt that
fits but leaves less room than max_tokens is accepted; it ends with finish_reason "length"
when it reaches the context limit.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np

from localinfer.backend import ModelRunner
from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.block_manager import BlockManager
from localinfer.engine.config import EngineConfig
from localinfer.engine.constrained_step import ConstrainedStep
from localinfer.engine.continuations import Continuations
from localinfer.engine.outputs import EngineStats, RequestOutput
from localinfer.engine.sampler import Sampler, make_generator, token_logprob
from localinfer.engine.scheduler import Scheduler
from localinfer.engine.sequence import Sequence
from localinfer.engine.sliding_window import SlidingWindowPool, min_pool_blocks
from localinfer.engine.speculator import Speculator
from localinfer.engine.text_stream import TextStream
from localinfer.engine.verifier import verify
from localinfer.errors import (
    ContextLengthExceededError,
    EngineClosedError,
    InvalidRequestError,
)
from localinfer.sampling_params import SamplingParams
from localinfer.structured.guide import GuideFactory


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        config: EngineConfig,
        detokenizer_cls: Any = None,
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        if config.num_blocks is None:
            config.num_blocks = runner.num_blocks
        if (config.num_blocks, config.block_size) != (runner.num_blocks, runner.block_size):
            raise InvalidRequestError(
                f"engine config ({config.num_blocks} blocks of {config.block_size}) does not "
                f"match the runner's KV pool ({runner.num_blocks} of {runner.block_size})"
            )
        if detokenizer_cls is None:
            from localinfer.tokenizer import IncrementalDetokenizer as detokenizer_cls
        self.detokenizer_cls = detokenizer_cls
        self.block_manager = BlockManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.block_manager.on_free = runner.free_sequence
        # finished requests' exact ids, for chat prompts that continue them (LLM.encode sets
        # it; engine-only users and fakes go without)
        self.continuations: Continuations | None = None
        self.scheduler = Scheduler(config, self.block_manager, tokenizer.eog_ids)
        # a runner that lays out its KV cache for these limits (llama.cpp: one stream per
        # sequence) may hold shorter sequences or fewer live ones: the scheduler keeps both
        max_len, max_running = runner.fit_kv(config.max_num_seqs, self.scheduler.max_model_len)
        self.scheduler.max_model_len = min(self.scheduler.max_model_len, max_len)
        self.scheduler.max_running = max_running
        # sliding-window layers (gemma3): their own pool, blocks freed as they leave the window
        self.sliding: SlidingWindowPool | None = None
        window = runner.sliding_window
        if window:
            num_swa = runner.num_swa_blocks or config.num_blocks
            least = min_pool_blocks(window, config.block_size, config.num_blocks)
            if num_swa < least:
                raise InvalidRequestError(
                    f"sliding-window KV pool of {num_swa} blocks cannot hold one sequence's "
                    f"window of {window} tokens (needs {least} blocks of {config.block_size})")
            self.sliding = SlidingWindowPool(num_swa, config.block_size, window)
            self.scheduler.sliding = self.sliding
            self.block_manager.limit_hits = self.sliding.limit_hits
        self.speculator: Speculator | None = None
        if config.speculative is not None:
            if not runner.supports_speculation:
                raise InvalidRequestError(
                    f"the {runner.name} backend cannot roll back rejected guesses: "
                    "speculative decoding is not available with it")
            from localinfer.engine.proposer import make_proposer

            proposer = make_proposer(config.speculative, runner, tokenizer,
                                     self.scheduler.max_model_len, config.max_num_seqs,
                                     config.draft_backend_options)
            self.speculator = Speculator(proposer,
                                         config.num_speculative_tokens,
                                         config.speculative_max_decodes,
                                         runner.token_group)
            self.scheduler.speculator = self.speculator
            self.block_manager.on_truncate = runner.rollback
        self.sampler = Sampler()
        self.guides = GuideFactory(tokenizer)  # compiled constraints, shared by requests
        self.constrained = ConstrainedStep(self.scheduler, self.guides, runner.threads)
        self.streams: dict[int, TextStream] = {}
        self._seq_ids = itertools.count()
        self._pending: list[RequestOutput] = []  # abort outputs, emitted by the next step
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # held through each step, taken by close(): the runners are freed only between steps
        self._step_lock = threading.Lock()
        self._closing = self._closed = False

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt_logits: bool = False,
    ) -> int:
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("invalid prompt: it has no tokens")
        n_vocab = self.tokenizer.n_vocab
        bad = [t for t in prompt_token_ids if not 0 <= t < n_vocab]
        if bad:
            raise InvalidRequestError(f"invalid prompt: token id {bad[0]} not in [0, {n_vocab})")
        if n > self.max_model_len:
            exc = ContextLengthExceededError(n, self.max_model_len)
            if self.max_model_len < self.config.max_model_len:
                exc.args = (f"{exc} (the KV cache holds {self.max_model_len} tokens)",)
            raise exc
        params.validate()
        if params.logit_bias:
            bad = [t for t in params.logit_bias if t >= n_vocab]
            if bad:
                raise InvalidRequestError(
                    f"invalid logit_bias: token id {bad[0]} not in [0, {n_vocab})")
        guide = None if params.structured is None else self.guides.guide(params.structured)
        self.constrained.active |= guide is not None
        seq_id = next(self._seq_ids)
        seq = Sequence(
            seq_id=seq_id,
            request_id=request_id if request_id is not None else f"req-{seq_id}",
            token_ids=list(prompt_token_ids),
            sampling_params=params,
            prompt_logits=prompt_logits,
            generator=make_generator(params),
            guide=guide,
        )
        self.streams[seq_id] = TextStream(
            self.detokenizer_cls(self.tokenizer), params.stop, params.include_stop_str_in_output
        )
        self.scheduler.add(seq)
        self.prompt_tokens_total += n
        return seq_id

    def abort_request(self, seq_id: int) -> None:
        """Free the request's blocks now; its final output (reason "abort") comes with the
        next step(). Unknown or finished ids are ignored."""
        seq = self.scheduler.abort(seq_id)
        if seq is not None:
            self.streams.pop(seq_id, None)
            self._pending.append(self._output(seq, "", []))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    def step(self) -> list[RequestOutput]:
        with self._step_lock:
            if self._closing:
                raise EngineClosedError("the engine was closed: it runs no more steps")
            return self._step()

    def close(self) -> None:
        """Free the runner (and the draft model's) once the step in flight, if any, is done.
        A server's engine thread can still be inside a step when shutdown stops waiting for it
        (a first compile runs for tens of seconds); freeing the model under that step would
        crash the process, so close waits for it, and later steps raise EngineClosedError."""
        self._closing = True  # before the lock: no step starts after the one in flight
        with self._step_lock:
            if self._closed:
                return
            self._closed = True
            if self.speculator is not None:
                self.speculator.proposer.close()
            self.runner.close()

    def _step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        guided, masked = self.constrained.start(batch)
        t_step = time.perf_counter()
        logits = self.runner.execute(batch)
        t_step = time.perf_counter() - t_step
        sample_seqs, sample_rows, speculating = self._collect_logits(batch, logits)
        if self.speculator is not None:
            self._observe_decode_step(batch, sample_seqs, speculating, t_step)
        # every row, in order (the usual decode step): no copy of (n_seqs, n_vocab) floats
        all_rows = sample_rows == list(range(len(logits)))
        rows = logits if all_rows else logits[sample_rows]
        mask_s = self.constrained.apply(rows, sample_seqs, logits, speculating, masked)
        tokens = self.sampler(rows, sample_seqs)
        sampled = {seq.seq_id: [t] for seq, t in zip(sample_seqs, tokens, strict=True)}
        logprobs = {
            seq.seq_id: [token_logprob(rows[i], tokens[i], seq.sampling_params.logprobs)]
            for i, seq in enumerate(sample_seqs)
            if seq.sampling_params.logprobs is not None
        }
        for seq, spec_rows in speculating:
            verified = verify(logits[spec_rows], seq, seq.spec_token_ids)
            sampled[seq.seq_id] = verified
            k = seq.sampling_params.logprobs
            if k is not None:
                logprobs[seq.seq_id] = [token_logprob(logits[r], t, k)
                                        for r, t in zip(spec_rows, verified, strict=False)]
        updated = self.scheduler.postprocess(batch, sampled)
        errors = self.constrained.advance(updated, len(guided), mask_s) if guided else {}
        for seq, new_tokens in updated:
            out = self._process_tokens(seq, new_tokens)
            if seq.seq_id in logprobs:
                out.logprobs = logprobs[seq.seq_id][: len(out.token_ids)]
            out.error = errors.get(seq.seq_id)
            outputs.append(out)
        return outputs

    def _observe_decode_step(self, batch: ScheduledBatch, sample_seqs: list[Sequence],
                             speculating: list[tuple[Sequence, list[int]]],
                             seconds: float) -> None:
        """Time the step for the speculator when every sequence in it decoded, with or
        without guesses (a last prefill chunk also samples, but brings its whole chunk)."""
        guessed = sum(len(rows) - 1 for _, rows in speculating)
        n_seqs = len(sample_seqs) + len(speculating)
        if n_seqs == batch.num_seqs and batch.num_tokens == n_seqs + guessed:
            assert self.speculator is not None
            self.speculator.observe_step(seconds, guessed, n_seqs)

    def _collect_logits(
        self, batch: ScheduledBatch, logits: np.ndarray
    ) -> tuple[list[Sequence], list[int], list[tuple[Sequence, list[int]]]]:
        """Which logits row each sampling sequence uses, and the rows of each speculating
        one (its last token's, then one per guess); stores prompt-logits rows."""
        row_of = {flat: row for row, flat in enumerate(batch.logits_indices)}
        seqs: list[Sequence] = []
        rows: list[int] = []
        speculating: list[tuple[Sequence, list[int]]] = []
        for i, seq_id in enumerate(batch.seq_ids):
            seq = self.scheduler.seqs.get(seq_id)
            if seq is None:
                continue  # aborted while the step ran
            start, end = batch.seq_starts[i], batch.seq_starts[i + 1]
            if seq.prompt_logits:
                first_pos = batch.positions[start]
                for flat in range(start, end):
                    if first_pos + flat - start < seq.num_prompt_tokens:
                        seq.prompt_logits_rows.append(logits[row_of[flat]].copy())
            if seq.sampling_params.prompt_logprobs is not None and not seq.prompt_logprobs_sent:
                self._score_prompt(seq, batch.positions[start:end], start, row_of, logits)
            n_guesses = len(seq.spec_token_ids)
            if batch.context_lens[i] != seq.num_tokens + n_guesses:
                continue  # a prefill chunk short of the last token
            if n_guesses:
                speculating.append(
                    (seq, [row_of[flat] for flat in range(end - 1 - n_guesses, end)]))
            else:
                seqs.append(seq)
                rows.append(row_of[end - 1])
        return seqs, rows, speculating

    @staticmethod
    def _score_prompt(seq: Sequence, positions: list[int], flat0: int, row_of: dict[int, int],
                      logits: np.ndarray) -> None:
        """Prompt logprobs of a prefill chunk: the row at position p scores prompt token
        p + 1 (with the top k). Only the next missing position is taken, so a chunk
        recomputed after a preemption adds nothing twice."""
        k = seq.sampling_params.prompt_logprobs
        assert k is not None
        for j, pos in enumerate(positions):
            if pos == len(seq.prompt_logprobs) and pos + 1 < seq.num_prompt_tokens:
                row = logits[row_of[flat0 + j]]
                seq.prompt_logprobs.append(token_logprob(row, seq.token_ids[pos + 1], k))

    def _process_tokens(self, seq: Sequence, tokens: list[int]) -> RequestOutput:
        """Stream the step's new tokens of a sequence as plain decoding would, one at a
        time: a stop string matched inside a speculative run finishes the sequence there and
        the tokens after it are dropped."""
        stream = self.streams[seq.seq_id]
        params = seq.sampling_params
        text = ""
        emitted: list[int] = []
        for j, token in enumerate(tokens):
            emitted.append(token)
            stopped_by_token = j == len(tokens) - 1 and seq.finish_reason == "stop" and (
                token in params.stop_token_ids
                or (token in self.tokenizer.eog_ids and not params.ignore_eos)
            )
            if not stopped_by_token:
                text += stream.add(token)
            if stream.stopped and not seq.is_finished:
                del seq.token_ids[seq.num_tokens - (len(tokens) - 1 - j):]
                self.scheduler.finish_stopped(seq)
            if stream.stopped:
                break
        self.generation_tokens_total += len(emitted)
        if seq.is_finished:
            text += stream.finish()
            del self.streams[seq.seq_id]
            if self.continuations is not None and seq.finish_reason in ("stop", "length"):
                self.continuations.remember(seq.token_ids)
        return self._output(seq, text, emitted)

    def _output(self, seq: Sequence, text: str, token_ids: list[int]) -> RequestOutput:
        finished = seq.is_finished
        prompt_logits = None
        if finished and seq.prompt_logits and seq.prompt_logits_rows:
            prompt_logits = np.stack(seq.prompt_logits_rows).astype(np.float32, copy=False)
            seq.prompt_logits_rows.clear()
        prompt_logprobs = None
        if token_ids and seq.sampling_params.prompt_logprobs is not None and (
                not seq.prompt_logprobs_sent):
            prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, []
            seq.prompt_logprobs_sent = True
        return RequestOutput(
            seq_id=seq.seq_id,
            request_id=seq.request_id,
            text=text,
            token_ids=token_ids,
            finished=finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            prompt_logits=prompt_logits,
            prompt_logprobs=prompt_logprobs,
        )

    def stats(self) -> EngineStats:
        bm = self.block_manager
        spec = self.speculator
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            block_size=bm.block_size,
            prefix_cache_hit_tokens=bm.prefix_hit_tokens,
            prefix_cache_queried_tokens=bm.prefix_queried_tokens,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_preemptions=self.scheduler.num_preemptions,
            prefill_backlog_tokens=self.scheduler.prefill_backlog_tokens(),
            spec_proposed_tokens=spec.proposed_tokens if spec is not None else 0,
            spec_accepted_tokens=spec.accepted_tokens if spec is not None else 0,
            spec_verifications=spec.verifications if spec is not None else 0,
        )
