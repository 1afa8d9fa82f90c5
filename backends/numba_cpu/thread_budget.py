"""ThreadBudget: how many of the runner's threads a step may use, from the cores other
processes leave free.

Numba's OpenMP workers wait for the next parallel region by spinning, and a decode step runs
a few hundred short regions.  While another process keeps a core busy, every region waits for
whichever of our threads the OS has just descheduled, and the spinning one takes time the
other could have used: decode with 2 threads beside one busy process measured 47 tok/s here
(SmolLM2, avx2), 1 thread 100-127 tok/s, 2 threads on a quiet machine 209.  Sleeping waits
(OMP_WAIT_POLICY=PASSIVE) fix the busy case but cost 60% on a quiet machine, where waking a
sleeping worker for every region is slow.  So the workers keep spinning and the step uses
fewer of them while the machine is busy:

    spare = cores we may run on - CPU time the other processes used (in cores), measured
            over the last `interval` seconds from /proc/stat and our own CPU time
    threads = clamp(floor(spare + SLACK), 1, configured)

Re-measured at most every `interval` seconds, so a step costs nothing extra.  Where
/proc/stat does not exist (macOS, Windows) or LOCALINFER_ADAPTIVE_THREADS=0, the budget is
the configured count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ADAPTIVE_ENV = "LOCALINFER_ADAPTIVE_THREADS"
# a neighbour using less than 0.6 of a core still leaves room for all our threads
SLACK = 0.4
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cores_seconds(cpus: set[int], path: str = "/proc/stat") -> float | None:
    """CPU seconds the `cpus` have spent busy since boot (everything but idle and iowait;
    steal counts as busy: the hypervisor gave that time to someone else), or None."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        total += v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return total / _TICK


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class ThreadBudget:
    def __init__(self, threads: int, interval: float = 0.5,
                 busy: Callable[[], float | None] | None = None,
                 own: Callable[[], float] = _own_cpu_seconds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threads = threads
        self.interval = interval
        try:
            self._cpus = set(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            self._cpus = set(range(os.cpu_count() or 1))
        self._busy = busy or (lambda: busy_cores_seconds(self._cpus))
        self._own, self._clock = own, clock
        off = os.environ.get(ADAPTIVE_ENV, "").strip() == "0"
        self._last = None if off or threads <= 1 else self._sample()
        self.current = threads

    def _sample(self) -> tuple[float, float, float] | None:
        busy = self._busy()
        return None if busy is None else (self._clock(), busy, self._own())

    def now(self) -> int:
        """The thread count for the next step."""
        if self._last is None:
            return self.current
        t0, busy0, own0 = self._last
        if self._clock() - t0 < self.interval:
            return self.current
        sample = self._sample()
        if sample is None:
            return self.current
        t1, busy1, own1 = sample
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / max(t1 - t0, 1e-9)
        spare = len(self._cpus) - others
        self.current = max(1, min(self.threads, int(spare + SLACK)))
        self._last = sample
        return self.current
