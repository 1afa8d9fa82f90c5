"""ThreadBudget: a step uses fewer threads while other processes keep cores busy, all of them
on a quiet machine, and the configured count where it cannot measure."""

from __future__ import annotations

import os
import sys
import time

import pytest
from localinfer.backends.numba_cpu.thread_budget import ThreadBudget, busy_cores_seconds

from localinfer.bench.load import competing_load


class Machine:
    """A fake clock, /proc/stat busy total and own CPU time."""

    def __init__(self) -> None:
        self.t = self.busy = self.own = 0.0

    def advance(self, seconds: float, others: float, ours: float) -> None:
        self.t += seconds
        self.own += ours * seconds
        self.busy += (others + ours) * seconds


def budget(m: Machine, threads: int = 2) -> ThreadBudget:
    b = ThreadBudget(threads, interval=0.5, busy=lambda: m.busy, own=lambda: m.own,
                     clock=lambda: m.t)
    b._cpus = {0, 1}
    return b


def test_budget_follows_the_other_processes_load() -> None:
    m = Machine()
    b = budget(m)
    m.advance(1.0, others=0.05, ours=2.0)  # quiet: our own spinning threads don't count
    assert b.now() == 2
    m.advance(1.0, others=1.0, ours=1.0)  # a neighbour takes a core
    assert b.now() == 1
    m.advance(0.2, others=0.0, ours=2.0)  # within the interval: unchanged
    assert b.now() == 1
    m.advance(1.0, others=0.1, ours=1.0)  # it has gone
    assert b.now() == 2
    m.advance(1.0, others=2.0, ours=0.5)  # never below one thread
    assert b.now() == 1


def test_budget_is_fixed_when_it_cannot_measure_or_is_turned_off(monkeypatch) -> None:
    m = Machine()
    b = ThreadBudget(2, busy=lambda: None, clock=lambda: m.t)
    m.advance(5, others=2, ours=0)
    assert b.now() == 2
    monkeypatch.setenv("LOCALINFER_ADAPTIVE_THREADS", "0")
    b = budget(m)
    m.advance(5, others=2, ours=0)
    assert b.now() == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat (Linux)")
def test_real_busy_processes_lower_the_budget() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert busy_cores_seconds(set(os.sched_getaffinity(0))) > 0
    b = ThreadBudget(max(2, cpus), interval=0.5)
    with competing_load(cpus):  # every core taken by someone else
        time.sleep(1.0)
        assert b.now() == 1
