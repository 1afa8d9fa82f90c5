"""DraftProposer: a second, smaller model with the target's vocabulary guesses the next tokens.

Policy:
- The draft runs in the same process, on the target's backend and threads, with a KV pool and
  BlockManager of its own (no prefix caching: its blocks live only as long as the sequence).
- Sync: before proposing, the draft's KV is brought up to all of the target's tokens (the
  prompt, in chunks of CHUNK tokens, the first time; afterwards the tokens accepted since,
  plus the target's last token), batched over all speculating sequences per forward pass.
- Guesses: up to max(ks) greedy steps, one ScheduledBatch per step for every sequence still
  guessing. A sequence stops early once the draft's probability of its argmax falls below
  CONFIDENCE (0.4): an unsure guess is likely rejected and costs a target position. Guesses
  are argmaxes, so the verifier's one-hot q keeps rejection sampling exact.
- Rollback: `accepted` truncates the draft's blocks to the longest prefix of its tokens that
  the target kept (the runner's `rollback` hook is called through the BlockManager).
- A sequence whose blocks do not fit the draft's pool gets no guesses (never an error).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.block_manager import BlockManager
from localinfer.engine.proposer import Proposer
from localinfer.engine.sequence import Sequence
from localinfer.errors import InvalidRequestError
from localinfer.sampling_params import SamplingParams

CONFIDENCE = 0.4  # stop guessing once the draft's top probability falls below this
CHUNK = 512  # draft prefill tokens per sequence per forward pass


def check_vocab(draft_name: str, target_gguf: Any, draft_gguf: Any,
                target_tok: Any, draft_tok: Any) -> None:
    """The draft must share the target's tokens and special ids, else guesses mean nothing."""
    t_tokens = target_gguf.metadata.get("tokenizer.ggml.tokens")
    d_tokens = draft_gguf.metadata.get("tokenizer.ggml.tokens")
    if draft_tok.n_vocab != target_tok.n_vocab:
        raise InvalidRequestError(
            f"draft model {draft_name} has {draft_tok.n_vocab} tokens, "
            f"the target {target_tok.n_vocab}: a draft needs the target's vocabulary")
    if t_tokens is not None and d_tokens is not None and list(t_tokens) != list(d_tokens):
        i = next(i for i, (a, b) in enumerate(zip(t_tokens, d_tokens, strict=False)) if a != b)
        raise InvalidRequestError(
            f"draft model {draft_name}'s token {i} is {d_tokens[i]!r}, "
            f"the target's {t_tokens[i]!r}: a draft needs the target's vocabulary")
    for what, d, t in (("BOS id", draft_tok.bos_id, target_tok.bos_id),
                       ("EOS id", draft_tok.eos_id, target_tok.eos_id),
                       ("end-of-generation ids", sorted(draft_tok.eog_ids),
                        sorted(target_tok.eog_ids))):
        if d != t:
            raise InvalidRequestError(
                f"draft model {draft_name} has {what} {d}, the target {t}")


class DraftProposer(Proposer):
    name = "draft"
    runs_a_model = True

    def __init__(self, runner: Any, max_model_len: int, max_num_seqs: int = 16,
                 confidence: float | None = None) -> None:
        self.runner = runner
        self.confidence = CONFIDENCE if confidence is None else confidence
        self.block_size: int = runner.block_size
        # a runner with its own KV layout (llama.cpp) is laid out for the target's limits
        self.max_model_len, _ = runner.fit_kv(max_num_seqs, max_model_len)
        self.blocks = BlockManager(runner.num_blocks, runner.block_size, False)
        self.blocks.on_free = runner.free_sequence
        self.blocks.on_truncate = runner.rollback
        self.drafts: dict[int, Sequence] = {}  # target seq_id -> the draft's record
        self._base: dict[int, int] = {}  # target length when the last guesses were made

    def _draft(self, seq: Sequence) -> Sequence:
        d = self.drafts.get(seq.seq_id)
        if d is None:
            d = Sequence(seq.seq_id, seq.request_id, [], SamplingParams(), num_prompt_tokens=0)
            self.drafts[seq.seq_id] = d
        return d

    def _sync(self, d: Sequence, target: list[int]) -> None:
        """Keep the draft's computed K/V only where its tokens equal the target's."""
        n = min(d.num_computed_tokens, len(target))
        if d.token_ids[:n] != target[:n]:  # only after guesses the scheduler dropped
            n = next(i for i in range(n) if d.token_ids[i] != target[i])
        self._truncate(d, n)
        d.token_ids = list(target)

    def _truncate(self, d: Sequence, n: int) -> None:
        if n < d.num_computed_tokens or len(d.block_table) * self.block_size > n:
            self.blocks.truncate(d, n)
        d.num_computed_tokens = n
        del d.token_ids[n:]

    def _step(self, work: list[tuple[Sequence, int]]) -> dict[int, np.ndarray]:
        """One forward pass over (draft, n new tokens); the last row of each draft that
        reaches its last token comes back, keyed by seq_id."""
        batch = ScheduledBatch.empty(self.block_size)
        wants: list[int] = []
        for d, n in work:
            start, end = d.num_computed_tokens, d.num_computed_tokens + n
            batch.add_sequence(d.seq_id, d.token_ids[start:end], start, d.block_table)
            if end == d.num_tokens:
                batch.logits_indices.append(batch.num_tokens - 1)
                wants.append(d.seq_id)
            d.num_computed_tokens = end
        logits = self.runner.execute(batch)
        return {sid: logits[i] for i, sid in enumerate(wants)}

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in seqs]
        live: list[tuple[int, Sequence, int]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks, strict=True)):
            d = self._draft(seq)
            self._sync(d, seq.token_ids)
            # room for all tokens and k - 1 guesses' K/V (the last guess is never computed);
            # a full pool or context means no guesses, never an error
            room = min(k, self.max_model_len - seq.num_tokens)
            if room < 1 or not self.blocks.can_append(d, 0):
                continue
            room = min(room, self.blocks.lookahead_room(d) + 1)
            self.blocks.may_append(d, room - 1)
            self._base[seq.seq_id] = seq.num_tokens
            live.append((i, d, room))
        # catch up: every draft's K/V up to the target's last token, chunked
        rows: dict[int, np.ndarray] = {}
        while pending := [(d, min(CHUNK, d.num_tokens - d.num_computed_tokens))
                          for _, d, _ in live if d.num_computed_tokens < d.num_tokens]:
            rows.update(self._step(pending))
        while live:
            going: list[tuple[int, Sequence, int]] = []
            for i, d, room in live:
                row = rows.pop(d.seq_id, None)
                if row is None:  # nothing new to compute (should not happen): no guess
                    continue
                token = int(np.argmax(row))
                top = float(row[token])
                p = 1.0 / float(np.sum(np.exp(row - top)))  # softmax of the argmax
                if p < self.confidence:
                    continue
                out[i].append(token)
                d.token_ids.append(token)
                if len(out[i]) < room:
                    going.append((i, d, room))
            live = going
            if live:
                rows = self._step([(d, 1) for _, d, _ in live])
        return out

    def accepted(self, seq: Sequence, proposed: int, accepted: int) -> None:
        d = self.drafts.get(seq.seq_id)
        base = self._base.pop(seq.seq_id, None)
        if d is None or base is None:
            return
        keep = base
        target = seq.token_ids
        while (keep < d.num_computed_tokens and keep < len(target)
               and d.token_ids[keep] == target[keep]):
            keep += 1
        self._truncate(d, min(keep, d.num_computed_tokens))

    def free(self, seq: Sequence) -> None:
        self._base.pop(seq.seq_id, None)
        d = self.drafts.pop(seq.seq_id, None)
        if d is not None and d.block_table:
            self.blocks.free(d)

    def close(self) -> None:
        self.runner.close()
        self.runner.gguf.close()


def load_draft(model: str, target: Any, target_tokenizer: Any, max_model_len: int,
               max_num_seqs: int = 16, progress: bool = False,
               backend_options: dict[str, Any] | None = None) -> DraftProposer:
    """Open the draft (a catalog name, pulled like --model, or a .gguf path) on the target
    runner's backend and threads, with the target's backend options (llama.cpp's
    n_gpu_layers or flash_attn apply to both models) and as many KV blocks as the target's
    pool, after checking that its vocabulary is the target's."""
    from localinfer.catalog import Catalog
    from localinfer.engine.draft_file import draft_file
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
    from localinfer.tokenizer.cache import load_tokenizer

    source = Catalog.load().resolve(model, progress=progress)
    gguf = open_gguf(source)
    try:
        runner_cls = type(target)
        strict = not runner_cls.supports_any_architecture
        config = ModelConfig.from_gguf(gguf, strict_arch=strict)
        if config.arch in SUPPORTED_ARCHITECTURES:
            config.check_tensors(gguf)
        check_vocab(model, target.gguf, gguf, target_tokenizer, load_tokenizer(gguf))
        if config.sliding_window > 0 and any(config.swa_layers):
            raise InvalidRequestError(
                f"draft model {model} has sliding-window layers: not supported as a draft")
        path = draft_file(source)  # checked first: nothing is made for a misfit
        if path != source:
            gguf.close()
            gguf = open_gguf(path)
            config = ModelConfig.from_gguf(gguf, strict_arch=strict)
        runner = runner_cls(gguf, config, num_blocks=target.num_blocks,
                            block_size=target.block_size, threads=target.threads,
                            **(backend_options or {}))
        return DraftProposer(runner, min(max_model_len, config.n_ctx_train), max_num_seqs)
    except BaseException:
        gguf.close()
        raise
