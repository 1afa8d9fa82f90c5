"""KernelThread: every forward step of the process's Numba runners runs on one thread at a time.

Numba's OpenMP layer (GNU libgomp) keeps a team of worker threads for each thread that starts
parallel regions, and its workers wait for the next region by spinning only while the threads
it manages fit the CPUs; with more, it spins ~100 times and then sleeps, so every region pays a
futex wake-up.  A step that ran on a second thread (the chat's and the server's engine thread,
after the model's warm-up ran on another) therefore had two teams: an empty parallel region
took 25 us instead of 2.3, a decode step has a few hundred, and SmolLM2 decoded 70-100 tok/s on
the engine thread against 160-213 on the main one (2 cores).  So the steps have one owner:

- the first thread that asks owns the kernels and runs its steps itself: `localinfer run`, the
  bench and a script drive the engine from one thread and pay no hand-over;
- when another thread asks while the owner lives, a kernel thread takes over and runs every
  step from then on, whoever asks (the hand-over costs a queue put and an event);
- the previous owner's team is released (omp_pause_resource_all) the next time that thread
  asks, and libgomp frees a team whose thread exits (the chat's loader), so one team is left.

Handing every step to a dedicated thread from the start cost `localinfer run` 5-8% of its
decode speed here (SmolLM2, 2 cores, AVX2 pair: 133-137 against 139-148 tok/s, the medians of
alternated runs): the hand-over itself is ~40 us, but after a step the kernel thread had to
wake on a core where OpenMP's worker still spins, ~250 us before the next step started.  Only
a thread that ran steps, then stays alive and never asks again (a script's warm-up on the main
thread before it starts an EngineLoop) leaves its team behind, and then regions pay the
wake-ups above.  Runners of several models share the owner: their steps would compete for
the same cores anyway.
"""

from __future__ import annotations

import ctypes
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
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None
        self._server: threading.Thread | None = None
        self._retired: threading.Thread | None = None  # the owner before the server

    @property
    def ident(self) -> int | None:
        """The thread that runs steps now (None before the first)."""
        return None if self._owner is None else self._owner.ident

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the owning thread (directly when that is the caller); its exception,
        if any, is raised here."""
        me = threading.current_thread()
        with self._lock:
            if self._owner is None or (self._server is None and not self._owner.is_alive()):
                self._owner = me  # the first caller, or the next after an owner that exited
            elif self._owner is not me and self._server is None:
                self._retired = self._owner
                self._server = threading.Thread(target=self._serve, name="localinfer-kernels",
                                                daemon=True)
                self._owner = self._server
                self._server.start()
            direct = self._owner is me
            release = self._retired is me
            if release:
                self._retired = None
        if direct:
            return fn(*args)
        if release:
            _release_team()
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


def _release_team() -> None:
    """Free the calling thread's OpenMP team (OpenMP 5.0; a no-op where libgomp lacks it)."""
    try:  # the copy Numba's OpenMP layer loaded (RTLD_NOLOAD: none, where it loaded none)
        lib = ctypes.CDLL("libgomp.so.1", mode=getattr(os, "RTLD_NOLOAD", 0))
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):  # not loaded (no team to free), or too old
        return
    pause.argtypes = [ctypes.c_int]
    pause(1)  # omp_pause_soft: the team's threads exit, the next region makes a new one


_shared: KernelThread | None = None
_lock = threading.Lock()


def kernel_thread() -> KernelThread:
    """The process's KernelThread, made on first use."""
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
