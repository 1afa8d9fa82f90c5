"""EngineConfig: the sizes that bound one engine (batch, sequences, KV pool, context)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localinfer.errors import InvalidRequestError

# like llama.cpp, a modest default context; callers raise it up to the model's trained length
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_NUM_SPECULATIVE_TOKENS = 8  # measured: 5 -> 8 took code edits from 3.5x to 4.3x
MAX_SPECULATIVE_TOKENS = 64


@dataclass(slots=True)
class EngineConfig:
    """Scheduler and KV-pool limits.

    The KV pool is sized by `num_blocks` if given, else by `kv_cache_mb` (see
    `resolve_num_blocks`), else it holds two full-length sequences.
    """

    max_model_len: int = 2048
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    kv_cache_mb: float | None = None
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    # speculative decoding (speculator.py): the proposer ("ngram": prompt lookup; None: off),
    # the most tokens a sequence guesses per step, and the most decoding sequences a step
    # may have and still speculate
    speculative: str | None = None
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    speculative_max_decodes: int = 4
    # the draft model's runner keywords: the target's backend_options (n_gpu_layers, ...)
    draft_backend_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "num_speculative_tokens", "speculative_max_decodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(f"invalid {name}: must be an integer >= 1, got {value!r}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InvalidRequestError(f"invalid num_blocks: must be >= 1, got {self.num_blocks}")
        if self.kv_cache_mb is not None and not self.kv_cache_mb > 0:
            raise InvalidRequestError(f"invalid kv_cache_mb: must be > 0, got {self.kv_cache_mb}")
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(
                f"invalid num_speculative_tokens: at most {MAX_SPECULATIVE_TOKENS}, "
                f"got {self.num_speculative_tokens}")
        if self.speculative is not None and not self.speculative.strip():
            raise InvalidRequestError(
                "invalid speculative '': 'ngram' or a draft MODEL (catalog name or .gguf)")

    def resolve_num_blocks(self, kv_bytes_per_token: int) -> int:
        """Number of KV blocks for this config, given a runner's bytes of K+V per token
        (`ModelRunner.kv_bytes_per_token(model_config)`); also stores it in `num_blocks`."""
        if self.num_blocks is None:
            self.num_blocks = num_blocks_for(self, kv_bytes_per_token)
        return self.num_blocks


def num_blocks_for(config: EngineConfig, kv_bytes_per_token: int) -> int:
    """Blocks that fit in `config.kv_cache_mb` (or the default pool when it is None).

    A pool smaller than one block is an error. A pool smaller than `max_model_len` is allowed:
    the engine then caps the usable context at the pool's capacity and rejects longer prompts
    when they are added, since such a sequence could never run.
    """
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_mb is None:
        return 2 * cdiv(config.max_model_len, config.block_size)
    block_bytes = kv_bytes_per_token * config.block_size
    n = int(config.kv_cache_mb * 1024 * 1024) // block_bytes
    if n < 1:
        raise InvalidRequestError(
            f"kv_cache_mb={config.kv_cache_mb} cannot hold one KV block of {config.block_size} "
            f"tokens ({block_bytes} bytes); use at least {block_bytes / 2**20:.3f} MB"
        )
    return n


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
