"""What one bench run measures: sizes and repetitions, shared by parent and child processes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

# aggregate decode: this many sequences added at once
AGGREGATE_COUNTS = (1, 4, 16, 64)
# structured-output decode (--structured): constrained vs unconstrained at these counts
STRUCTURED_COUNTS = (1, 16)


@dataclass(slots=True)
class BenchPlan:
    model: str  # path to the .gguf file
    threads: int
    quick: bool = False
    backend: str = "numba"  # localinfer's backend (the llama.cpp side is always llama.cpp)
    n_gpu_layers: int = 0  # llamacpp backend only
    flash_attn: bool | None = None  # llamacpp backend only; None: llama.cpp decides
    n_ctx_train: int = 4096
    pp_tokens: int = 512  # prefill prompt (pp512)
    tg_prompt: int = 16  # single-stream decode starts after this many prompt tokens
    tg_tokens: int = 128  # tokens decoded single-stream (tg128)
    pos_prompt: int = 1000  # decode at context position ~1000
    pos_tokens: int = 64
    ttft_prompt: int = 128
    agg_prompt: int = 16
    agg_tokens: int = 128  # max_tokens per sequence in the aggregate runs
    agg_counts: list[int] = field(default_factory=lambda: list(AGGREGATE_COUNTS))
    pp_reps: int = 3
    tg_reps: int = 2
    ttft_reps: int = 5
    start_reps: int = 3
    structured: bool = False  # also run the structured-output group (localinfer only)
    structured_schema: str = ""  # JSON Schema text of the decode rows ("": the built-in one)
    mask_reps: int = 10  # fresh schemas timed to their first mask
    structured_reps: int = 3  # constrained/unconstrained decode pairs (median of them)
    load: int = 0  # competing busy processes beside every measurement (--load)
    label: str = ""  # progress prefix a child shows

    @classmethod
    def make(cls, model: str, threads: int, n_ctx_train: int, quick: bool) -> BenchPlan:
        p = cls(model=model, threads=threads, quick=quick, n_ctx_train=n_ctx_train)
        if quick:
            p.tg_tokens, p.pos_tokens, p.agg_tokens = 16, 8, 8
            p.pp_reps, p.tg_reps, p.ttft_reps, p.start_reps = 1, 1, 1, 1
            p.mask_reps, p.structured_reps = 3, 1
        # a model with a short context gets shorter runs, never an error
        room = n_ctx_train - 1
        p.pp_tokens = min(p.pp_tokens, room)
        p.ttft_prompt = min(p.ttft_prompt, room)
        p.tg_tokens = min(p.tg_tokens, room - p.tg_prompt - 1)
        p.pos_prompt = min(p.pos_prompt, room - p.pos_tokens - 1)
        p.agg_tokens = min(p.agg_tokens, room - p.agg_prompt - 1)
        if min(p.tg_tokens, p.pos_prompt, p.agg_tokens) < 2:
            raise ValueError(f"context length {n_ctx_train} is too short to benchmark")
        return p

    @property
    def single_ctx(self) -> int:
        """Context (KV tokens) of the single-stream group, the same on both sides."""
        need = max(self.pp_tokens, self.ttft_prompt, self.tg_prompt + self.tg_tokens,
                   self.pos_prompt + self.pos_tokens) + 1
        return round_up(need, 256)

    @property
    def batch_ctx(self) -> int:
        """KV tokens of the aggregate group: every sequence of the largest run at once."""
        per_seq = round_up(self.agg_prompt + self.agg_tokens, 16)
        return round_up(max(self.agg_counts) * per_seq, 256)

    @property
    def structured_ctx(self) -> int:
        """KV tokens of the structured group: its largest run, all sequences at once."""
        per_seq = round_up(self.agg_prompt + self.agg_tokens, 16)
        return round_up(max(STRUCTURED_COUNTS) * per_seq, 256)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchPlan:
        return cls(**json.loads(text))


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def prompt_ids(n_vocab: int, n: int, seed: int) -> list[int]:
    """Deterministic, distinct-per-seed prompt token ids (both sides use the same ones).

    The lowest ids, where vocabularies keep control tokens, are left out; a new seed per
    repetition means no prefix cache can help.
    """
    low = min(1000, n_vocab // 4)
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(low, n_vocab, n)]
