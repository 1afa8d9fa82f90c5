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
    loop = EngineLoop(make_engine(max_num_seqs=1), max_queue=2)  # not started: all stay queued
    loop.submit(PROMPTS[0], PARAMS)
    loop.submit(PROMPTS[1], PARAMS)
    with pytest.raises(QueueFullError):
        loop.submit(PROMPTS[2], PARAMS)
    loop.start()
    loop.shutdown(drain_timeout=5)
    assert loop.num_in_flight == 0
    with pytest.raises(EngineStoppedError):
        loop.submit(PROMPTS[0], PARAMS)


def test_shutdown_drains_in_flight() -> None:
    loop = EngineLoop(make_engine()).start()
    handles = [loop.submit(p, PARAMS) for p in PROMPTS]
    loop.shutdown(drain_timeout=10)
    for p, h in zip(PROMPTS, handles, strict=True):
        assert collect(h)[0] == reference(p)
