"""ModelSlot: one model's place in the server (its LLM, engine thread, scheduler and KV pool),
and Lease: one request's hold on a loaded slot.

A slot is LOADING until its load finishes (READY) or fails (`error`), and UNLOADING once the
pool has taken it out to free its memory. While any lease is held the slot is busy: it is
neither evicted nor expired. Releasing the last lease stamps `last_used`, from which the
keep-alive expiry counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.server.models.memory_plan import ModelNeed
from localinfer.server.models.served import ServedModel

if TYPE_CHECKING:
    from localinfer.engine.engine_loop import EngineLoop
    from localinfer.server.protocol import APIError


class SlotState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADING = "unloading"


@dataclass(eq=False)  # identity: a reload of the same model is another slot
class ModelSlot:
    model: ServedModel
    keep_alive: float | None  # seconds once idle; None: until the server stops
    state: SlotState = SlotState.LOADING
    llm: Any = None  # localinfer.llm.LLM
    loop: EngineLoop | None = None
    need: ModelNeed | None = None
    error: APIError | None = None
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = 0.0  # wall clock
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def idle(self) -> bool:
        return self.state is SlotState.READY and self._in_flight == 0

    @property
    def max_model_len(self) -> int:
        return int(self.llm.engine.max_model_len)

    def expires_in(self, now: float | None = None) -> float | None:
        """Seconds until the keep-alive runs out (0 if it has); None while busy or pinned."""
        if self.keep_alive is None or self._in_flight:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.last_used
        return max(self.keep_alive - elapsed, 0.0)

    def hold(self) -> None:
        with self._lock:
            self._in_flight += 1

    def let_go(self) -> int:
        with self._lock:
            self._in_flight -= 1
            self.last_used = time.monotonic()
            return self._in_flight

    def close(self) -> None:
        """Stop the engine thread (aborting what still runs) and free the model; blocking."""
        if self.loop is not None:
            self.loop.shutdown(drain_timeout=0)
        if self.llm is not None:
            self.llm.close()  # waits for a step in flight (LLMEngine.close)


class Lease:
    """A request's hold on a loaded model: what the routes read (`llm`, `loop`, `model_id`,
    `max_model_len`), counted in flight until `release` (idempotent). As a context manager it
    releases on exit; `released_on_error` releases only if the block raises (a generation job
    that took the lease over releases it when the job closes)."""

    def __init__(self, slot: ModelSlot, on_release: Callable[[ModelSlot], None]) -> None:
        self.slot = slot
        self._on_release = on_release
        self._released = False
        self._lock = threading.Lock()

    @property
    def llm(self) -> Any:
        return self.slot.llm

    @property
    def loop(self) -> EngineLoop:
        assert self.slot.loop is not None
        return self.slot.loop

    @property
    def model_id(self) -> str:
        return self.slot.id

    @property
    def max_model_len(self) -> int:
        return self.slot.max_model_len

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._on_release(self.slot)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[Lease]:
        try:
            yield self
        except BaseException:
            self.release()
            raise
