"""ModelPool: loads models on demand, unloads them when idle or when another needs the room.

Policy (all decisions are taken on the event loop, so they need no lock; blocking work —
pulling, reading GGUF headers, loading, warming up, closing — runs on worker threads):
- `acquire(name)` resolves the name (404 if unknown), then waits for the model's slot to be
  loaded; concurrent requests for a model that is loading share that one load.
- A load first estimates the model's need (MemoryPlan) and reserves it. When it does not fit,
  the least recently used idle model (READY, nothing in flight) is unloaded, and again, until
  it fits; if it cannot (larger than the whole budget, or the rest is busy or loading), the
  request gets 503 naming needed, budget and in-use MB, and nothing is loaded.
- A failed load answers its waiters and every later request for that model with the same
  error (a broken file stays broken); a 503 for memory is not remembered (room may free up).
- keep_alive: each request sets its model's (request field, else the server default);
  0 unloads the model when its last request finishes, None never expires it; an expiry task
  unloads idle models whose time is up.
- Unloading takes the slot out of the table first (a new request starts a fresh load), stops
  its engine thread, closes the LLM and only then returns its reservation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localinfer.server.config import ServerConfig
from localinfer.server.models.keep_alive import describe
from localinfer.server.models.memory_plan import MemoryPlan, ModelNeed, estimate, mb
from localinfer.server.models.served import ServedModel, ServedModels
from localinfer.server.models.slot import Lease, ModelSlot, SlotState
from localinfer.server.protocol import APIError, unavailable

log = logging.getLogger("localinfer.server")
EXPIRY_TICK_S = 0.25


class ModelPool:
    snapshot_labels: tuple[str, ...] = ("model",)  # what engine_snapshots' first field names

    def __init__(self, config: ServerConfig, served: ServedModels, plan: MemoryPlan,
                 default_keep_alive: float | None) -> None:
        self.config = config
        self.served = served
        self.plan = plan
        self.default_keep_alive = default_keep_alive
        self.slots: dict[str, ModelSlot] = {}
        self.closed = False
        self._aio: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # each engine loop reports its abort-to-free seconds here (ServerMetrics)
        self.on_abort_freed: Any = None

    # -- requests ------------------------------------------------------------------------------

    async def acquire(self, name: str | None, keep_alive: float | None | str = "default"
                      ) -> Lease:
        """A lease on the loaded model `name` (None: the default model). keep_alive: seconds,
        None for forever, "default" for the slot's default."""
        model = self.served.resolve(name)
        while True:
            if self.closed:
                raise unavailable("the server is shutting down")
            slot = self.slots.get(model.id) or self._start_load(model)
            await slot.loaded.wait()
            if slot.error is not None:
                raise slot.error
            if slot.state is not SlotState.READY:  # unloaded while we waited: load it again
                continue
            slot.hold()
            if keep_alive != "default":
                slot.keep_alive = keep_alive  # type: ignore[assignment]
            return Lease(slot, self._released)

    def _released(self, slot: ModelSlot) -> None:
        """A lease was released, on the event loop or (rarely) another thread."""
        if slot.let_go() == 0 and slot.keep_alive == 0:
            aio = self._aio
            if aio is not None and not aio.is_closed():
                aio.call_soon_threadsafe(self._unload_if_expired, slot)

    def _unload_if_expired(self, slot: ModelSlot) -> None:
        if slot.idle and slot.expires_in() == 0 and self.slots.get(slot.id) is slot:
            self._spawn(self.unload(slot))

    # -- loading -------------------------------------------------------------------------------

    def _start_load(self, model: ServedModel, keep_alive: float | None | str = "default"
                    ) -> ModelSlot:
        ka = self.default_keep_alive if keep_alive == "default" else keep_alive
        slot = ModelSlot(model, ka)  # type: ignore[arg-type]
        self.slots[model.id] = slot
        self._spawn(self._load(slot))
        return slot

    async def _load(self, slot: ModelSlot) -> None:
        start = time.perf_counter()
        try:
            path = await asyncio.to_thread(self.served.local_path, slot.model)
            slot.need = need = await asyncio.to_thread(self._estimate, path)
            await self._make_room(slot, need.total)
            self.plan.reserve(slot, need.total)
            llm, loop = await self._open_async(path)
            slot.llm, slot.loop = llm, loop
            if self.closed or self.slots.get(slot.id) is not slot:  # shut down meanwhile
                await asyncio.to_thread(slot.close)
                raise unavailable("the server is shutting down")
            slot.state, slot.loaded_at = SlotState.READY, time.time()
            slot.last_used = time.monotonic()
            log.info("model %s ready in %.1f s (%s MB weights + %s MB KV, context %d tokens; "
                     "keep-alive %s)", slot.id, time.perf_counter() - start,
                     mb(need.weights_bytes), mb(need.kv_bytes), slot.max_model_len,
                     describe(slot.keep_alive))
        except APIError as exc:
            self._fail(slot, exc, remember=exc.status != 503)
        except Exception as exc:
            log.exception("loading model %s failed", slot.id)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._fail(slot, APIError(500, f"the model '{slot.id}' failed to load: {first}",
                                      type="server_error", code="model_load_failed"))
        finally:
            slot.loaded.set()

    def _fail(self, slot: ModelSlot, error: APIError, remember: bool = True) -> None:
        slot.state, slot.error = SlotState.FAILED, error
        self.plan.release(slot)
        if not remember and self.slots.get(slot.id) is slot:
            del self.slots[slot.id]

    async def _make_room(self, slot: ModelSlot, need: int) -> None:
        if need > self.plan.budget:
            raise unavailable(self.plan.shortfall(slot.id, need), retry_after=60)
        while not self.plan.fits(need):
            idle = [s for s in self.slots.values() if s.idle and s is not slot]
            if not idle:
                raise unavailable(self.plan.shortfall(slot.id, need), retry_after=5)
            victim = min(idle, key=lambda s: s.last_used)
            log.info("unloading idle model %s to make room for %s", victim.id, slot.id)
            await self.unload(victim)

    async def _open_async(self, path: Path) -> tuple[Any, Any]:
        return await asyncio.to_thread(self._open, path)

    def _open(self, path: Path) -> tuple[Any, Any]:
        return open_engine(self.config, path, self.on_abort_freed)

    def _estimate(self, path: Path) -> ModelNeed:
        return estimate(path, self.config)

    # -- unloading -----------------------------------------------------------------------------

    async def unload(self, slot: ModelSlot) -> None:
        if self.slots.get(slot.id) is slot:
            del self.slots[slot.id]
        if slot.state is not SlotState.READY:
            return
        slot.state = SlotState.UNLOADING
        try:
            await asyncio.to_thread(slot.close)
        finally:
            self.plan.release(slot)
        log.info("unloaded model %s", slot.id)

    async def unload_name(self, name: str) -> tuple[bool, bool]:
        """Unload the model `name` now, or, while requests use it, when the last one finishes
        (they are not cut short). (was loaded, unload pending on running requests)."""
        model = self.served.resolve(name)
        slot = self.slots.get(model.id)
        if slot is None:
            return False, False
        await slot.loaded.wait()
        if slot.state is not SlotState.READY:
            return False, False
        slot.keep_alive = 0
        if slot.idle:
            await self.unload(slot)
            return True, False
        return True, True

    async def expire(self) -> None:
        """The expiry task: unload idle models whose keep-alive has run out."""
        while not self.closed:
            now = time.monotonic()
            for slot in list(self.slots.values()):
                if slot.idle and slot.expires_in(now) == 0:
                    await self.unload(slot)
            await asyncio.sleep(EXPIRY_TICK_S)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """On the server's event loop: start the expiry task."""
        self._aio = asyncio.get_running_loop()
        self._spawn(self.expire())

    async def preload(self, model: ServedModel) -> APIError | None:
        """Load `model` before any request asks (the default model at start); its error."""
        slot = self.slots.get(model.id) or self._start_load(model)
        await slot.loaded.wait()
        return slot.error

    def abort_all(self) -> None:
        """Stop every engine thread now (the drain ran out of time); thread-safe."""
        for slot in list(self.slots.values()):
            if slot.loop is not None:
                slot.loop.shutdown(drain_timeout=0)

    def close(self) -> None:
        """At server shutdown (connections are closed by then): free every model."""
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for slot in list(self.slots.values()):
            slot.close()
        self.slots.clear()

    def engine_snapshots(self) -> list[tuple[Any, Any, int, int]]:
        """(model id, EngineStats, queued, requests in flight) of each loaded model."""
        return [(s.id, s.loop.stats(), s.loop.num_queued, s.in_flight)
                for s in list(self.slots.values())
                if s.state is SlotState.READY and s.loop is not None]

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in list(self.slots.values()))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def open_engine(config: ServerConfig, path: Path,
                on_abort_freed: Callable[[float], None] | None = None) -> tuple[Any, Any]:
    """The model's LLM and its started engine loop, warmed up when the config says so;
    `on_abort_freed`: the loop's hook (EngineLoop.on_abort_freed)."""
    from localinfer.engine.engine_loop import EngineLoop
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    llm = LLM(path, backend=config.backend, threads=config.threads,
              max_model_len=config.max_model_len, kv_cache_mb=config.kv_cache_mb,
              max_num_seqs=config.max_num_seqs,
              max_num_batched_tokens=config.max_num_batched_tokens,
              enable_prefix_caching=config.enable_prefix_caching,
              backend_options=config.backend_options, progress=False, **config.speculative)
    try:
        loop = EngineLoop(llm.engine, max_queue=config.max_queue,
                          max_prefill_backlog=config.max_prefill_backlog)
        loop.on_abort_freed = on_abort_freed
        loop.start()
        if config.warmup:  # compile (or load from cache) every kernel before the first request
            params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            for _ in loop.submit(llm.encode("Hello"), params):
                pass
    except BaseException:
        llm.close()
        raise
    if config.warmup:
        import threading

        from localinfer.server.loading import warm_structured

        # llguidance's view of the vocabulary, beside serving: only the first constrained
        # request waits for it
        threading.Thread(target=warm_structured, args=(llm,), name="localinfer-warm",
                         daemon=True).start()
    return llm, loop
