"""MemoryPlan: how much of the machine the server's models may hold, decided before loading.

Policy:
- A model's need is its weights (the GGUF file's size, plus a draft model's file when it
  speculates with one) plus its KV pool (the runner's bytes per token times the blocks the
  engine will allocate for the configured context, max_num_seqs and --kv-cache-mb).
- The budget is --max-memory, else DEFAULT_SHARE of the machine's RAM: the rest is left to
  the OS, the activations of a step and whatever else the user runs.
- A load reserves its need before a byte is read; the reservation is returned when the model
  is unloaded (or its load fails). The pool (pool.py) checks `fits` first and evicts
  idle models to make room; what still does not fit is a 503 worded by `shortfall`, with the
  needed, budget and in-use MB.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.errors import InvalidRequestError

DEFAULT_SHARE = 0.75  # of total RAM, when --max-memory is not given
MB = 1 << 20
_UNITS = {"": MB, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": MB, "mb": MB,
          "mib": MB, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_memory(text: str) -> int:
    """'4096' (MB), '512MB', '8G', '1.5GiB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise InvalidRequestError(
            f"invalid memory size {text!r}: a number of MB or with a unit (e.g. 4096, 8G, 512MB)")
    return int(float(m.group(1)) * _UNITS[unit])


def total_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget() -> int:
    return int(total_ram() * DEFAULT_SHARE)


def mb(n: int) -> str:
    return f"{n / MB:.0f}"


@dataclass(frozen=True, slots=True)
class ModelNeed:
    weights_bytes: int
    kv_bytes: int

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_bytes


def estimate(path: Path, config: Any) -> ModelNeed:
    """What loading `path` under the server config (ServerConfig) will hold, read from the
    GGUF header only (no tensor data)."""
    from localinfer.backend import get_backend
    from localinfer.engine.config import DEFAULT_MAX_MODEL_LEN, EngineConfig, num_blocks_for
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    runner_cls = get_backend(config.backend)
    with open_gguf(path) as gguf:
        model = ModelConfig.from_gguf(gguf, strict_arch=not runner_cls.supports_any_architecture)
    engine = EngineConfig(
        max_model_len=min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, model.n_ctx_train),
        max_num_seqs=config.max_num_seqs, kv_cache_mb=config.kv_cache_mb)
    # every layer at full length: an upper bound for a runner with a smaller sliding pool
    per_token = runner_cls.kv_bytes_per_token(model)
    kv = num_blocks_for(engine, per_token) * engine.block_size * per_token
    weights = path.stat().st_size
    draft = config.speculative.get("speculative")
    if draft and draft != "ngram" and Path(draft).is_file():
        weights += Path(draft).stat().st_size
    return ModelNeed(weights, kv)


class MemoryPlan:
    """Reservations (by model slot) against one budget; thread-safe."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._held: dict[object, int] = {}  # by ModelSlot: a reload is another key
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def held(self, key: object) -> int:
        with self._lock:
            return self._held.get(key, 0)

    def fits(self, need: int) -> bool:
        return need <= self.budget - self.in_use

    def reserve(self, key: object, need: int) -> None:
        with self._lock:
            in_use = sum(self._held.values())
            if need > self.budget - in_use:
                raise MemoryError(f"{need} bytes do not fit ({in_use} of {self.budget} used)")
            self._held[key] = need

    def release(self, key: object) -> None:
        with self._lock:
            self._held.pop(key, None)

    def shortfall(self, name: str, need: int) -> str:
        """Why `need` bytes for `name` cannot be had, with the numbers."""
        used = self.in_use
        if need > self.budget:
            why = "more than the whole budget"
        else:
            why = "more than is free; the loaded models that hold the rest are busy or loading"
        return (f"not enough memory for model '{name}': it needs {mb(need)} MB, the budget is "
                f"{mb(self.budget)} MB and {mb(used)} MB are in use ({why}); raise "
                "--max-memory, or lower --ctx / --max-num-seqs / --kv-cache-mb")
