"""Test doubles for the engine: a runner that simulates a paged KV cache, a byte-free tokenizer."""

from __future__ import annotations

import numpy as np

from localinfer.backend import ModelRunner
from localinfer.engine.batch import ScheduledBatch
from localinfer.engine.config import EngineConfig
from localinfer.engine.llm_engine import LLMEngine

N_VOCAB = 64
EOS = 0


class FakeRunner(ModelRunner):
    """Logits are a fixed function of the whole context, which it reads back from the KV
    slots the batch names, as a paged KV cache would; reading a slot that was never written
    (or that holds another position) fails the test."""

    def __init__(self, num_blocks: int, block_size: int, order: int | None = None) -> None:
        self.threads = None  # no GGUF file to own
        self.num_blocks = num_blocks
        self.block_size = block_size
        # order n: logits depend only on the last n tokens (read back from the KV slots), so
        # greedy text soon repeats itself (prompt lookup then guesses right); None: on all
        self.order = order
        self.kv: dict[int, tuple[int, int, tuple[int, ...]]] = {}  # slot -> (pos, hash, last)
        self.num_steps = 0
        self.rollbacks: list[tuple[int, int, list[int]]] = []

    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        self.num_steps += 1
        bs = batch.block_size
        ctx: list[int] = []
        for i in range(batch.num_seqs):
            table = batch.block_tables[i]
            for flat in range(batch.seq_starts[i], batch.seq_starts[i + 1]):
                pos = batch.positions[flat]
                assert batch.slot_mapping[flat] == table[pos // bs] * bs + pos % bs
                prev, last = 0, ()
                if pos > 0:
                    slot = table[(pos - 1) // bs] * bs + (pos - 1) % bs
                    assert slot in self.kv, f"read of unwritten KV slot {slot}"
                    stored_pos, prev, last = self.kv[slot]
                    assert stored_pos == pos - 1, "KV slot holds another position"
                token = batch.token_ids[flat]
                h = hash((prev, token, pos)) & 0xFFFFFFFF
                last = (*last, token)[-(self.order or 1):]
                self.kv[batch.slot_mapping[flat]] = (pos, h, last)
                ctx.append(h if self.order is None else hash(last) & 0xFFFFFFFF)
            assert batch.context_lens[i] == batch.positions[batch.seq_starts[i + 1] - 1] + 1
        rows = [fake_logits(ctx[j]) for j in batch.logits_indices]
        return np.stack(rows) if rows else np.zeros((0, N_VOCAB), np.float32)


    def rollback(self, seq_id: int, num_tokens: int, freed_blocks: list[int]) -> None:
        self.rollbacks.append((seq_id, num_tokens, list(freed_blocks)))


def fake_logits(h: int) -> np.ndarray:
    x = np.random.default_rng(h).standard_normal(N_VOCAB).astype(np.float32) * 3
    x[EOS] -= 6.0  # generations rarely end on their own
    return x


class FakeTokenizer:
    n_vocab = N_VOCAB
    eog_ids = frozenset({EOS})


def piece(token_id: int) -> str:
    return "<eos>" if token_id == EOS else chr(ord("a") + token_id % 26)


class FakeDetokenizer:
    def __init__(self, tokenizer: FakeTokenizer) -> None:
        self.text = ""

    def add(self, token_id: int) -> str:
        self.text += piece(token_id)
        return piece(token_id)

    def flush(self) -> str:
        return ""


def make_engine(num_blocks=64, block_size=4, order: int | None = None, **kw) -> LLMEngine:
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, **kw)
    return LLMEngine(FakeRunner(num_blocks, block_size, order), FakeTokenizer(), config,
                     FakeDetokenizer)


