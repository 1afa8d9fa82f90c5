"""EngineLoop: LLMEngine.step() on a background thread, fed from any thread or event loop.

The HTTP server and the TUI submit requests and read their outputs without ever blocking on a
forward pass: kernels release the GIL, so the event loop keeps running while the engine
computes. The engine itself is touched only by the loop thread; other threads send commands.

A paced handle (submit(..., paced=True), for a UI that shows text a frame at a time) wakes its
event loop for the first output and the end of the stream only; in between the reader takes
what has arrived on its own schedule (RequestHandle.batch). Each wake-up runs the UI thread for
a moment on a core one of the kernels' two threads is using, and stalls the other at the next
barrier: on 2 cores, alternated runs of `localinfer bench chat` (SmolLM2) gave visible / engine
0.74-0.84 woken per token and 0.88-0.93 paced.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localinfer.engine.llm_engine import LLMEngine
from localinfer.engine.outputs import EngineStats, RequestOutput
from localinfer.errors import LocalInferError
from localinfer.sampling_params import SamplingParams
from localinfer.structured.spec import StructuredOutputError


class QueueFullError(LocalInferError):
    """Too many requests are waiting; the caller should retry later."""


class EngineStoppedError(LocalInferError):
    """The engine is shutting down and takes no new requests."""


class EngineFailure(LocalInferError):
    """The engine raised while this request was in flight; the loop keeps serving others."""


@dataclass(slots=True)
class _Failure:
    error: BaseException


_DONE = object()


class RequestHandle:
    """One request's output stream; iterate it from a thread, or `async for` from asyncio."""

    def __init__(self, loop: EngineLoop, aio: asyncio.AbstractEventLoop | None,
                 paced: bool = False) -> None:
        self.seq_id = -1
        self._engine_loop = loop
        self._aio = aio
        self._paced = paced and aio is not None
        self._aq: asyncio.Queue[Any] | None = (
            asyncio.Queue() if aio is not None and not self._paced else None)
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # paced: outputs wait here; `_arrived` is set (from the engine thread, through the
        # event loop) when the reader is `_armed` for the next output, or at the end
        self._waiting: deque[Any] = deque()
        self._arrived = asyncio.Event() if self._paced else None
        self._armed = False
        self.finished = False
        self.aborted = False  # set by any thread; the engine thread honours it
        self.abort_time = 0.0  # time.perf_counter() when abort() was asked

    def _put(self, item: Any) -> None:  # called on the engine thread
        if self._paced:
            self._waiting.append(item)
            if self._armed or item is _DONE or isinstance(item, _Failure):
                self._armed = False
                assert self._aio is not None and self._arrived is not None
                with contextlib.suppress(RuntimeError):  # the reader's loop is closed
                    self._aio.call_soon_threadsafe(self._arrived.set)
            return
        if self._aio is not None and self._aq is not None:
            # RuntimeError: the consumer's event loop is closed, nobody is listening
            with contextlib.suppress(RuntimeError):
                self._aio.call_soon_threadsafe(self._aq.put_nowait, item)
        else:
            self._q.put(item)

    def _unwrap(self, item: Any) -> RequestOutput | None:
        if item is _DONE:
            self.finished = True
            return None
        if isinstance(item, _Failure):
            self.finished = True
            raise EngineFailure(f"generation failed: {item.error}") from item.error
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        while not self.finished:
            out = self._unwrap(self._q.get())
            if out is not None:
                yield out

    async def batch(self, until: float | None = None) -> list[RequestOutput] | None:
        """Paced reading (submit(..., aio=True, paced=True)): every output that has arrived,
        in order; None once the stream has ended and everything was read.  until=None: wait
        for the next output, woken as it arrives; else sleep until time.perf_counter() reaches
        `until` (outputs arriving meanwhile do not wake the event loop; the end of the stream
        does) and return what came, possibly nothing.  A failure raises EngineFailure once
        the outputs before it were returned."""
        assert self._paced and self._arrived is not None, "submit(..., paced=True)"
        while True:
            outs = self._take_waiting()
            if outs or self.finished:
                return outs or None
            self._arrived.clear()
            if until is None:
                self._armed = True
                if self._waiting:  # arrived between the take and the arming
                    self._armed = False
                    continue
                await self._arrived.wait()
                continue
            delay = until - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), delay)
            return self._take_waiting() or (None if self.finished else [])

    def _take_waiting(self) -> list[RequestOutput]:
        """The outputs waiting, up to the end of the stream (which marks the handle finished,
        or raises for a failure when nothing comes before it)."""
        outs: list[RequestOutput] = []
        while self._waiting:
            item = self._waiting.popleft()
            if (item is _DONE or isinstance(item, _Failure)) and outs:
                self._waiting.appendleft(item)  # the end, next time: these come first
                break
            out = self._unwrap(item)
            if out is None:
                break
            outs.append(out)
        return outs

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        assert self._aq is not None, "submit(..., aio=True) for async iteration"
        while not self.finished:
            out = self._unwrap(await self._aq.get())
            if out is not None:
                yield out

    def abort(self) -> None:
        if not self.finished and not self.aborted:
            self.abort_time = time.perf_counter()
            self.aborted = True
            self._engine_loop.abort(self)


class EngineLoop:
    def __init__(self, engine: LLMEngine, *, max_queue: int | None = None,
                 max_prefill_backlog: int | None = None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.max_prefill_backlog = max_prefill_backlog
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._handles: dict[int, RequestHandle] = {}
        self._stats = engine.stats()
        self._stats_lock = threading.Lock()
        self._num_queued = 0  # submitted, not yet admitted by the engine thread
        self._queued_tokens = 0  # their prompt tokens
        self._count_lock = threading.Lock()
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="localinfer-engine", daemon=True)
        self.step_hook: Callable[[], None] | None = None  # tests inject faults here
        # seconds from an abort being asked (a client gone) to its sequence's blocks being
        # free, for each sequence the engine held: the wait is the engine step in progress
        self.on_abort_freed: Callable[[float], None] | None = None

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    # -- any thread ----------------------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        aio: bool = False,
        paced: bool = False,
    ) -> RequestHandle:
        """Queue a request; errors in it (bad ids, too long) surface when iterating.  aio: read
        it from the calling event loop; paced (with aio): through RequestHandle.batch."""
        self.check_admission()
        handle = RequestHandle(self, asyncio.get_running_loop() if aio else None, paced)
        params.validate()
        with self._count_lock:
            self._num_queued += 1
            self._queued_tokens += len(prompt_token_ids)

        def add() -> None:
            try:
                if handle.aborted:  # aborted before the engine ever saw it
                    handle._put(_DONE)
                    return
                try:
                    handle.seq_id = self.engine.add_request(prompt_token_ids, params, request_id)
                except Exception as exc:  # a bad request fails alone
                    handle._put(_Failure(exc))
                    return
                self._handles[handle.seq_id] = handle
                # publish before un-counting, so the queue limit never sees it in neither
                self._publish_stats()
            finally:
                with self._count_lock:
                    self._num_queued -= 1
                    self._queued_tokens -= len(prompt_token_ids)

        self._send(add)
        return handle

    def abort(self, handle: RequestHandle) -> None:
        def do_abort() -> None:
            if handle.seq_id in self._handles:
                # the engine emits a final "abort" output on its next step, which ends
                # the handle's stream; the blocks are free already
                self.engine.abort_request(handle.seq_id)
                if self.on_abort_freed is not None:
                    self.on_abort_freed(time.perf_counter() - handle.abort_time)
                self._publish_stats()  # /metrics shows the blocks free without a step

        self._send(do_abort)

    def stats(self) -> EngineStats:
        with self._stats_lock:
            return self._stats

    def check_admission(self) -> None:
        """Raise what `submit` would refuse a new request with now (EngineStoppedError,
        QueueFullError). The server asks before it renders and tokenizes a prompt, so under
        overload a refusal costs a body parse, not a tokenization."""
        if not self._accepting:
            raise EngineStoppedError("the engine is shutting down")
        if self.max_queue is not None and self.num_waiting_for_a_slot() >= self.max_queue:
            raise QueueFullError(f"request queue is full ({self.max_queue} waiting)")
        if self.max_prefill_backlog is not None and (
                backlog := self.prefill_backlog_tokens()) > self.max_prefill_backlog:
            raise QueueFullError(f"{backlog} prompt tokens are waiting for their prefill "
                                 f"(at most {self.max_prefill_backlog} admit a request)")

    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens admitted but not computed yet, the queued requests' included: the
        prefill a request admitted now waits behind before its own (so `max_prefill_backlog`
        bounds a new request's time to first token, not just the queue's length)."""
        return self.stats().prefill_backlog_tokens + self._queued_tokens

    def num_waiting_for_a_slot(self) -> int:
        """Requests not running yet less the running slots free now (negative: slots left
        over): what `max_queue` bounds, so 0 admits only what can run at once. A burst at an
        idle engine runs max_num_seqs of its requests at once (found by `bench soak
        --overload`: counting those as waiting refused requests that had a slot)."""
        stats = self.stats()
        free = max(self.engine.config.max_num_seqs - stats.num_running, 0)
        return stats.num_waiting + self._num_queued - free

    @property
    def num_queued(self) -> int:
        """Requests submitted but not yet handed to the engine."""
        return self._num_queued

    @property
    def num_in_flight(self) -> int:
        return len(self._handles) + self._num_queued

    def shutdown(self, drain_timeout: float = 30.0) -> None:
        """Stop taking requests, let in-flight ones finish (up to the timeout), abort the
        rest, and stop the thread."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self.num_in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        for handle in list(self._handles.values()):
            handle.abort()
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _send(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    # -- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._drain_commands()
            if not self.engine.has_unfinished_requests():
                self._publish_stats()
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                if self.step_hook is not None:
                    self.step_hook()
                outputs = self.engine.step()
            except Exception as exc:
                self._fail_all(exc)
                continue
            for out in outputs:
                handle = self._handles.get(out.seq_id)
                if handle is None:
                    continue
                if out.error is not None:  # this request failed alone
                    handle._put(_Failure(StructuredOutputError(out.error)))
                    del self._handles[out.seq_id]
                    continue
                handle._put(out)
                if out.finished:
                    handle._put(_DONE)
                    del self._handles[out.seq_id]
            self._publish_stats()
        self._drain_commands()

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _fail_all(self, exc: BaseException) -> None:
        """An exception inside the engine: every in-flight request gets it, their sequences
        are aborted (blocks freed), and the loop carries on with new requests."""
        for seq_id, handle in list(self._handles.items()):
            self.engine.abort_request(seq_id)
            handle._put(_Failure(exc))
        self._handles.clear()

    def _publish_stats(self) -> None:
        stats = self.engine.stats()
        with self._stats_lock:
            self._stats = stats
