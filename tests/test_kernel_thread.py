"""KernelThread: every forward step runs on one thread, whichever thread asks for it (one OpenMP
team for the process: a step started from a second thread paid a futex wake-up per parallel
region, kernel_thread.py)."""

from __future__ import annotations

import threading

import pytest
from gguf_factory import QT, write_tiny_llama

pytest.importorskip("numba")

from localinfer.backends.numba_cpu.kernel_thread import KernelThread, kernel_thread  # noqa: E402

from localinfer.engine.engine_loop import EngineLoop  # noqa: E402
from localinfer.llm import LLM  # noqa: E402
from localinfer.sampling_params import SamplingParams  # noqa: E402


def test_calls_from_any_thread_run_on_the_kernel_thread() -> None:
    kt = KernelThread()
    seen: list[int] = []

    def ask() -> None:
        seen.append(kt.run(threading.get_ident))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    ask()
    assert seen == [kt.ident] * 4
    assert kt.run(lambda a, b: a + b, 2, 3) == 5
    assert kt.run(kt.run, lambda: 7) == 7  # a call made on the thread itself runs at once

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        kt.run(fail)
    assert kt.run(threading.get_ident) == kt.ident  # still serving after an error


def test_steps_from_the_main_and_the_engine_thread_run_on_one_thread(tmp_path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=QT.Q4_1, embd_type=QT.Q8_0)
    llm = LLM(str(path), threads=2, max_model_len=256)
    runner = llm.engine.runner
    ran_on: set[int] = set()
    step = runner._step

    def spy(*args):
        ran_on.add(threading.get_ident())
        return step(*args)

    runner._step = spy
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = [5, 17, 42, 9]
    engine = llm.engine
    engine.add_request(prompt, params)
    on_main: list[int] = []
    while engine.has_unfinished_requests():
        on_main += [t for out in engine.step() for t in out.token_ids]
    loop = EngineLoop(engine).start()
    try:
        on_engine_thread = [t for out in loop.submit(prompt, params) for t in out.token_ids]
    finally:
        loop.shutdown()
    assert on_engine_thread == on_main and len(on_main) == 6
    assert ran_on == {kernel_thread().ident}
    assert threading.get_ident() not in ran_on
    llm.close()
