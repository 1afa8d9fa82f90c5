"""KernelThread: forward steps run on one thread at a time: the first caller's, then one kernel
thread once another thread asks (one OpenMP team for the process: a step started from a second
thread paid a futex wake-up per parallel region, kernel_thread.py)."""

from __future__ import annotations

import threading

import pytest
from gguf_factory import QT, write_tiny_llama

pytest.importorskip("numba")

from localinfer.backends.numba_cpu.kernel_thread import KernelThread, kernel_thread  # noqa: E402

from localinfer.engine.engine_loop import EngineLoop  # noqa: E402
from localinfer.llm import LLM  # noqa: E402
from localinfer.sampling_params import SamplingParams  # noqa: E402


def _on_new_thread(fn):
    got: list = []
    t = threading.Thread(target=lambda: got.append(fn()))
    t.start()
    t.join(timeout=10)
    return got[0]


def test_the_first_caller_runs_its_calls_until_another_thread_asks() -> None:
    kt = KernelThread()
    me = threading.get_ident()
    assert kt.run(threading.get_ident) == me == kt.ident  # no hand-over for a lone caller
    assert kt.run(lambda a, b: a + b, 2, 3) == 5
    other = _on_new_thread(lambda: kt.run(threading.get_ident))
    server = kt.ident
    assert other == server and server not in (me, None)
    # from now on every call runs on that thread, the first caller's included
    assert kt.run(threading.get_ident) == server
    assert _on_new_thread(lambda: kt.run(threading.get_ident)) == server
    assert kt.run(kt.run, threading.get_ident) == server  # a call made there runs at once

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        kt.run(fail)
    assert kt.run(threading.get_ident) == server  # still serving after an error


def test_a_thread_that_exited_hands_the_kernels_on_without_a_server() -> None:
    kt = KernelThread()
    first = _on_new_thread(lambda: kt.run(threading.get_ident))
    assert kt.run(threading.get_ident) == threading.get_ident() != first
    assert kt.ident == threading.get_ident()


def test_steps_move_to_one_thread_once_the_engine_thread_asks(tmp_path, monkeypatch) -> None:
    """Steps from the main thread run there; once an EngineLoop steps too, every step runs on
    one kernel thread (the main thread's next ones as well), and the main thread's OpenMP team
    is released when it next asks."""
    from localinfer.backends.numba_cpu import kernel_thread as kt_module

    released: list[int] = []
    real_release = kt_module._release_team
    monkeypatch.setattr(kt_module, "_release_team",
                        lambda: (released.append(threading.get_ident()), real_release()))
    monkeypatch.setattr(kt_module, "_shared", None)  # a KernelThread of this test's own
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=QT.Q4_1, embd_type=QT.Q8_0)
    llm = LLM(str(path), threads=2, max_model_len=256)
    runner = llm.engine.runner
    ran_on: set[int] = set()
    step = runner._step

    def spy(*args):
        ran_on.add(threading.get_ident())
        return step(*args)

    spy.py_func = step.py_func  # what a first step's compile-ahead helper reads
    runner._step = spy
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = [5, 17, 42, 9]
    engine = llm.engine
    engine.add_request(prompt, params)
    on_main: list[int] = []
    while engine.has_unfinished_requests():
        on_main += [t for out in engine.step() for t in out.token_ids]
    assert ran_on == {threading.get_ident()} == {kernel_thread().ident}
    ran_on.clear()
    loop = EngineLoop(engine).start()
    try:
        on_engine_thread = [t for out in loop.submit(prompt, params) for t in out.token_ids]
    finally:
        loop.shutdown()
    assert on_engine_thread == on_main and len(on_main) == 6
    server = kernel_thread().ident
    assert ran_on == {server} and server != threading.get_ident() and released == []
    engine.add_request(prompt, params)
    again: list[int] = []
    while engine.has_unfinished_requests():
        again += [t for out in engine.step() for t in out.token_ids]
    assert again == on_main and ran_on == {server}
    assert released == [threading.get_ident()]  # once, on the main thread's first hand-over
    llm.close()
