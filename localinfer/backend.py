"""ModelRunner: the only thing a backend implements — one scheduled batch in, logits out.

Backends are registered by name and imported lazily, so `import localinfer` stays light.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from localinfer.errors import BackendUnavailableError, InvalidRequestError

if TYPE_CHECKING:
    import numpy as np

    from localinfer.engine.batch import ScheduledBatch
    from localinfer.gguf_file import GGUFFile
    from localinfer.model_config import ModelConfig


class ModelRunner(ABC):
    """Owns the weights and the physical KV pool of one model.

    The pool has `num_blocks` blocks of `block_size` token slots per layer; the engine's
    BlockManager decides which block ids a sequence uses, the runner only reads and writes them.
    """

    name: str = "abstract"
    # True for runners that take any architecture their library knows (llama.cpp): LLM then
    # validates the GGUF file but not the architecture's hyperparameters and tensors
    supports_any_architecture: ClassVar[bool] = False
    # True for runners that keep sliding-window layers' K/V in a pool of their own
    # (engine/sliding_window.py): LLM then sizes it and passes num_swa_blocks=
    sliding_window_pool: ClassVar[bool] = False
    # such a runner sets these for its model: the window (tokens; 0 = no sliding layers) and
    # the pool's blocks; the engine then gives every batch swa_block_tables / swa_slot_mapping
    sliding_window: int = 0
    num_swa_blocks: int | None = None
    # True for runners that can take speculative guesses (engine/speculator.py): a sequence's
    # step then carries its last token and k guesses, logits come back for all of them, and
    # rollback() drops the rejected ones. A runner whose K/V live at the engine's slot mapping
    # has nothing to drop (the default); one that keeps K/V of its own must implement rollback
    supports_speculation: ClassVar[bool] = True
    # a step's cost rises in groups of this many tokens per sequence (the Numba runner's
    # vpdpbusd paths: 4, measured in its isa.py); a cheap proposer's guesses are then sized so
    # a sequence's 1 + k tokens fill whole groups (engine/adaptive_k.py); 1: every token counts
    token_group: int = 1

    def __init__(
        self,
        gguf: GGUFFile,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        threads: int | None = None,
        progress: bool = False,
    ) -> None:
        self.gguf = gguf
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.threads = threads

    @classmethod
    def kv_bytes_per_token(cls, config: ModelConfig) -> int:
        """Bytes of K and V per token over all layers (f16 by default)."""
        return 2 * config.n_layers * config.n_kv_heads * config.head_dim * 2

    @abstractmethod
    def execute(self, batch: ScheduledBatch) -> np.ndarray:
        """Run one step: write the batch's K/V into the pool, return float32 logits of shape
        (len(batch.logits_indices), n_vocab) in the order of batch.logits_indices. The engine
        may modify them in place (structured-output masks) until the next execute()."""

    def fit_kv(self, max_num_seqs: int, max_model_len: int) -> tuple[int, int | None]:
        """Called once by the engine before the first step: the longest sequence and the most
        live sequences (None: no limit) this runner's KV layout holds for an engine of these
        limits.  A runner whose pool any sequence may fill (the default) changes neither."""
        return max_model_len, None

    def free_sequence(  # noqa: B027 - optional hook
        self, seq_id: int, block_table: list[int], cached: set[int]
    ) -> None:
        """The engine freed a sequence's blocks (finished, aborted or preempted); `cached`
        are those it keeps in its prefix cache. Runners that own the block pool ignore it."""

    def rollback(  # noqa: B027 - optional hook
        self, seq_id: int, num_tokens: int, freed_blocks: list[int]
    ) -> None:
        """The engine rejected speculative guesses: the sequence's K/V now end at position
        num_tokens, and `freed_blocks` (its table's blocks past them) went back to the pool.
        A runner that writes K/V only where the slot mapping says and reads only up to
        context_lens needs nothing: the next step rewrites those positions before reading."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (memory maps, threads)."""


# name -> "module:Class"; modules are imported only when the backend is asked for
_REGISTRY: dict[str, tuple[str, str]] = {
    "numba": ("localinfer.backends.numba_cpu.runner:NumbaModelRunner", "numba"),
    "llamacpp": ("localinfer.backends.llamacpp.runner:LlamaCppModelRunner", "llamacpp"),
    "triton": ("localinfer.backends.triton_cuda.runner:TritonModelRunner", "cuda"),
}


def register_backend(name: str, target: str, extra: str = "") -> None:
    _REGISTRY[name] = (target, extra)


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> type[ModelRunner]:
    if name not in _REGISTRY:
        raise InvalidRequestError(
            f"unknown backend {name!r} (known: {', '.join(available_backends())})"
        )
    target, extra = _REGISTRY[name]
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (install it with: pip install 'localinfer[{extra}]')" if extra else ""
        raise BackendUnavailableError(
            f"backend {name!r} is not available: {exc}{hint}"
        ) from exc
    return getattr(module, cls_name)
