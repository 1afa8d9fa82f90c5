"""EngineLoop: the engine on a background thread, driven from threads and from asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_fakes import make_engine

from localinfer.engine.engine_loop import (
    EngineFailure,
    EngineLoop,
    EngineStoppedError,
    QueueFullError,
)
from localinfer.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = [[1 + (5 * i + j) % 60 for j in range(4 + 3 * i)] for i in range(6)]


def collect(handle) -> tuple[list[int], str | None]:
    toks, reason = [], None
    for out in handle:
        toks += out.token_ids
        reason = out.finish_reason
    return toks, reason


def reference(prompt) -> list[int]:
    engine = make_engine()
    engine.add_request(prompt, PARAMS)
    toks = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            toks += out.token_ids
    return toks


def wait_until(cond, timeout=5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_concurrent_threads_get_their_own_outputs() -> None:
    loop = EngineLoop(make_engine()).start()
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        results[i] = collect(loop.submit(PROMPTS[i], PARAMS))[0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert all(results[i] == reference(PROMPTS[i]) for i in range(len(PROMPTS)))
    loop.shutdown()


def test_asyncio_streams() -> None:
    async def main() -> list[list[int]]:
        loop = EngineLoop(make_engine()).start()

        async def one(p):
            toks = []
            async for out in loop.submit(p, PARAMS, aio=True):
                toks += out.token_ids
            return toks

        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            loop.shutdown()

    assert asyncio.run(main()) == [reference(p) for p in PROMPTS]


def test_abort_frees_blocks_promptly() -> None:
    engine = make_engine()
    loop = EngineLoop(engine).start()
    long = SamplingParams(max_tokens=10_000, ignore_eos=True)
    loop.step_hook = lambda: time.sleep(0.001)
    handle = loop.submit(PROMPTS[3], long)
    it = iter(handle)
    next(it)
    assert loop.stats().kv_blocks_used > 0
    handle.abort()
    rest = list(it)
    assert rest and rest[-1].finish_reason == "abort"
    wait_until(lambda: loop.stats().kv_blocks_used == 0 and loop.stats().num_running == 0, 1.0)
    loop.shutdown()


def test_abort_before_admission() -> None:
    loop = EngineLoop(make_engine())  # not started: the request is still only queued
    handle = loop.submit(PROMPTS[0], PARAMS)
    handle.abort()
    loop.start()
    assert collect(handle) == ([], None)
    wait_until(lambda: loop.num_in_flight == 0)
    loop.shutdown()


def test_bad_request_fails_alone() -> None:
    loop = EngineLoop(make_engine()).start()
    bad = loop.submit([10_000], PARAMS)
    with pytest.raises(EngineFailure, match="token id"):
        collect(bad)
    assert collect(loop.submit(PROMPTS[0], PARAMS))[0] == reference(PROMPTS[0])
    loop.shutdown()


def test_engine_exception_fails_in_flight_and_keeps_serving() -> None:
    engine = make_engine()
    loop = EngineLoop(engine)
    calls = {"n": 0}

    def boom() -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("kernel exploded")

    loop.step_hook = boom
    loop.start()
    with pytest.raises(EngineFailure, match="kernel exploded"):
        collect(loop.submit(PROMPTS[1], PARAMS))
    wait_until(lambda: loop.stats().kv_blocks_used == 0)
    assert collect(loop.submit(PROMPTS[1], PARAMS))[0] == reference(PROMPTS[1])
    loop.shutdown()


def test_queue_limit_and_shutdown() -> None:
    # not started: all stay queued; the first has the one running slot, two may wait for it
    loop = EngineLoop(make_engine(max_num_seqs=1), max_queue=2)
    loop.submit(PROMPTS[0], PARAMS)
    loop.submit(PROMPTS[1], PARAMS)
    loop.submit(PROMPTS[2], PARAMS)
    with pytest.raises(QueueFullError):
        loop.submit(PROMPTS[3], PARAMS)
    loop.start()
    loop.shutdown(drain_timeout=5)
    assert loop.num_in_flight == 0
    with pytest.raises(EngineStoppedError):
        loop.submit(PROMPTS[0], PARAMS)


def test_queue_limit_zero_admits_what_can_run_at_once() -> None:
    # max_queue 0 once refused every request, the server's own warm-up included
    loop = EngineLoop(make_engine(max_num_seqs=2), max_queue=0)  # not started
    loop.submit(PROMPTS[0], PARAMS)
    loop.submit(PROMPTS[1], PARAMS)
    with pytest.raises(QueueFullError):
        loop.submit(PROMPTS[2], PARAMS)
    loop.start()
    loop.shutdown(drain_timeout=5)


def test_prefill_backlog_limit_refuses_until_the_prompts_are_computed() -> None:
    # not started: prompts of 7 and 10 tokens wait for their prefill; a third is refused
    # while more than 10 prompt tokens wait, whatever the free slots
    loop = EngineLoop(make_engine(max_num_seqs=8), max_prefill_backlog=10)
    first, second = loop.submit(PROMPTS[1], PARAMS), loop.submit(PROMPTS[2], PARAMS)
    assert loop.prefill_backlog_tokens() == 7 + 10
    with pytest.raises(QueueFullError, match="17 prompt tokens are waiting"):
        loop.submit(PROMPTS[0], PARAMS)
    loop.step_hook = lambda: time.sleep(0.05)  # both still decode when the backlog is gone
    loop.start()
    wait_until(lambda: loop.prefill_backlog_tokens() == 0)
    assert loop.stats().num_running == 2
    third = loop.submit(PROMPTS[3], PARAMS)  # computed prompts admit a new request again
    for prompt, handle in ((PROMPTS[1], first), (PROMPTS[2], second), (PROMPTS[3], third)):
        assert collect(handle)[0] == reference(prompt)
    loop.shutdown(drain_timeout=5)


def test_shutdown_drains_in_flight() -> None:
    loop = EngineLoop(make_engine()).start()
    handles = [loop.submit(p, PARAMS) for p in PROMPTS]
    loop.shutdown(drain_timeout=10)
    for p, h in zip(PROMPTS, handles, strict=True):
        assert collect(h)[0] == reference(p)


class _CountingLoop:
    """Stands in for a handle's event loop: counts the wake-ups the engine thread asks for."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wakes = 0

    def call_soon_threadsafe(self, fn, *args):
        self.wakes += 1
        return self.loop.call_soon_threadsafe(fn, *args)


def test_paced_reading_gets_every_token_with_two_wakeups() -> None:
    """A paced handle (the chat's) wakes its event loop for the first output and the end only;
    a reader that sleeps between frames gets the outputs in batches, all of them, in order."""
    long = SamplingParams(max_tokens=40, ignore_eos=True)
    want = make_engine()
    want.add_request(PROMPTS[2], long)
    expected: list[int] = []
    while want.has_unfinished_requests():
        expected += [t for out in want.step() for t in out.token_ids]

    async def main() -> tuple[list[int], int, int]:
        loop = EngineLoop(make_engine())
        loop.step_hook = lambda: time.sleep(0.002)  # ~80 ms of stream
        handle = loop.submit(PROMPTS[2], long, aio=True, paced=True)
        counter = _CountingLoop(asyncio.get_running_loop())
        handle._aio = counter  # before the engine thread starts, so it sees every wake-up
        loop.start()
        toks: list[int] = []
        batches = 0
        until = None  # the first batch: woken by the first output
        try:
            while (outs := await handle.batch(until)) is not None:
                batches += 1
                toks += [t for out in outs for t in out.token_ids]
                until = time.perf_counter() + 0.03  # then a frame every 30 ms
        finally:
            loop.shutdown()
        return toks, batches, counter.wakes

    toks, batches, wakes = asyncio.run(main())
    assert toks == expected and len(toks) == 40
    assert batches < 20  # several tokens per frame
    assert wakes <= 2  # the first output, the end: not one per token


def test_paced_reading_returns_the_outputs_before_a_failure() -> None:
    async def main() -> tuple[list[int], BaseException | None]:
        loop = EngineLoop(make_engine())
        calls = {"n": 0}

        def boom() -> None:
            calls["n"] += 1
            if calls["n"] == 4:  # after the prefill and two decode steps
                raise RuntimeError("kernel exploded")

        loop.step_hook = boom
        handle = loop.submit(PROMPTS[1], PARAMS, aio=True, paced=True)
        loop.start()
        await asyncio.sleep(0.2)  # everything, failure included, has arrived: one batch
        toks: list[int] = []
        try:
            while (outs := await handle.batch(time.perf_counter())) is not None:
                toks += [t for out in outs for t in out.token_ids]
        except EngineFailure as exc:
            return toks, exc
        finally:
            loop.shutdown()
        return toks, None

    toks, error = asyncio.run(main())
    assert toks == reference(PROMPTS[1])[:3]
    assert error is not None and "kernel exploded" in str(error)


def test_close_waits_for_the_step_in_flight_and_later_steps_are_refused() -> None:
    """Shutdown stops waiting for the engine thread (a first compile can run for tens of
    seconds); closing the model then must wait for that step, not free the runner under it."""
    from localinfer.errors import EngineClosedError

    engine = make_engine()
    events: list[str] = []
    in_step, release = threading.Event(), threading.Event()
    execute, close = engine.runner.execute, engine.runner.close

    def slow_execute(batch):
        in_step.set()
        release.wait(timeout=10)
        events.append("step done")
        return execute(batch)

    def logged_close() -> None:
        events.append("runner closed")
        close()

    engine.runner.execute, engine.runner.close = slow_execute, logged_close
    loop = EngineLoop(engine).start()
    handle = loop.submit(PROMPTS[0], PARAMS)
    assert in_step.wait(timeout=5)
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(timeout=0.3)
    assert closer.is_alive() and events == []  # close is waiting for the step
    release.set()
    closer.join(timeout=5)
    assert events == ["step done", "runner closed"]
    with pytest.raises(EngineFailure):  # the next step is refused, the request fails cleanly
        collect(handle)
    with pytest.raises(EngineClosedError):
        engine.step()
    loop.shutdown(drain_timeout=0)
