"""KernelThread: every forward step of the process's Numba runners runs on one thread.

Numba's OpenMP layer (GNU libgomp) keeps a team of worker threads for each thread that starts
parallel regions, and its workers wait for the next region by spinning only while the threads
it manages fit the CPUs; with more, it spins ~100 times and then sleeps, so every region pays a
futex wake-up.  A step that ran on a second thread (the chat's and the server's engine thread,
after the model's warm-up ran on the main thread) therefore had two teams: an empty parallel
region took 25 us instead of 2.3, a decode step has a few hundred, and SmolLM2 decoded 70-100
tok/s on the engine thread against 160-213 on the main one (2 cores).  So whichever thread
asks, the step runs here, on the one thread that ever starts a parallel region, and one team
serves them all; the hand-over costs a queue put and an event, ~20-40 us per step.  Runners of
several models share the thread: their steps would compete for the same cores anyway.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any


class _Call:
    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class KernelThread:
    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="localinfer-kernels",
                                        daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the kernel thread (directly when called there); its exception, if
        any, is raised here."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        call = _Call(fn, args)
        self._calls.put(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call.result = call.fn(*call.args)
            except BaseException as exc:  # the caller re-raises it
                call.error = exc
            finally:
                call.done.set()


_shared: KernelThread | None = None
_lock = threading.Lock()


def kernel_thread() -> KernelThread:
    """The process's kernel thread, started on first use."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = KernelThread()
        return _shared


def _forget_after_fork() -> None:  # a forked child has none of its parent's threads
    global _shared, _lock
    _shared = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
