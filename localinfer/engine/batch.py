"""ScheduledBatch: what the scheduler hands a backend for one step.

Plain Python lists only (the scheduler depends on no array framework); backends convert them.
Tokens of all scheduled sequences are laid out flat, sequence after sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledBatch:
    seq_ids: list[int]  # one per scheduled sequence
    token_ids: list[int]  # (n_tokens,) flat
    positions: list[int]  # (n_tokens,) absolute position of each token in its sequence
    seq_starts: list[int]  # (n_seqs + 1,) tokens of sequence i are [seq_starts[i], seq_starts[i+1])
    context_lens: list[int]  # (n_seqs,) KV length of each sequence once this step is written
    block_tables: list[list[int]]  # (n_seqs, n_blocks_i) physical KV block ids, in order
    slot_mapping: list[int]  # (n_tokens,) block_id * block_size + offset where each new K/V goes
    logits_indices: list[int]  # flat token indices whose logits the step must return, in order
    block_size: int
    # sliding-window layers' own pool (engine/sliding_window.py), empty when the model has none:
    # per-sequence tables (-1 = a block released once it fell out of the window) and slots
    swa_block_tables: list[list[int]] = field(default_factory=list)
    swa_slot_mapping: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, block_size: int) -> ScheduledBatch:
        return cls([], [], [], [0], [], [], [], [], block_size)

    def add_sequence(self, seq_id: int, tokens: list[int], start: int,
                     block_table: list[int]) -> None:
        """Append a sequence's tokens for positions start.., their slots in its block table
        and its KV length once they are written (the scheduler's and the draft's batches)."""
        bs = self.block_size
        end = start + len(tokens)
        self.seq_ids.append(seq_id)
        self.token_ids.extend(tokens)
        self.positions.extend(range(start, end))
        self.slot_mapping.extend(block_table[p // bs] * bs + p % bs for p in range(start, end))
        self.seq_starts.append(self.num_tokens)
        self.context_lens.append(end)
        self.block_tables.append(list(block_table))

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
