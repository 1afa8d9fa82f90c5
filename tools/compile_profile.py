"""CPU seconds of each Numba compile in a cold start (an empty kernel cache), per function.

    python tools/compile_profile.py MODEL [--top N]

Loads MODEL with a fresh NUMBA_CACHE_DIR and generates two tokens, timing every
`numba:compile` event with the compiling thread's CPU clock (so another process on the machine
changes the figures little). A compile that triggers others counts them too: the times are
inclusive, largest first. The first line is the process's whole CPU time.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from typing import Any

os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-profile-")

from numba.core import event  # noqa: E402


class _CompileTimes(event.Listener):
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def on_start(self, ev: Any) -> None:
        if ev.kind == "numba:compile":
            ev.data["t0"] = time.thread_time()

    def on_end(self, ev: Any) -> None:
        if ev.kind == "numba:compile":
            d = ev.data["dispatcher"]
            name = f"{d.py_func.__module__.split('.')[-1]}.{d.py_func.__qualname__}"
            self.times.setdefault(name, []).append(time.thread_time() - ev.data["t0"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    listener = _CompileTimes()
    event.register("numba:compile", listener)
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    with LLM(args.model, threads=2, max_model_len=512) as llm:
        llm.generate("Hi", SamplingParams(max_tokens=2))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"process CPU {ru.ru_utime + ru.ru_stime:.1f} s")
    rows = sorted(((sum(v), len(v), k) for k, v in listener.times.items()), reverse=True)
    for seconds, n, name in rows[:args.top]:
        print(f"{seconds:7.2f} s  {n:3d}x  {name}")


if __name__ == "__main__":
    main()
