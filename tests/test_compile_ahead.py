"""A new step's kernels compiled in two processes: claims on cache entries (compile_claims.py)
and the compile helper (compile_ahead.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT
from gguf_factory import write_tiny_gemma3, write_tiny_llama

# a cached kernel in a module of its own, compiled by the processes below
KERNEL = textwrap.dedent("""
    from numba import njit

    @njit(cache=True)
    def kernel(x):
        return x * 2 + 1
""")

# A process that compiles `kernel`; with HOLD set it signals once it holds the claim and then
# keeps it for that many seconds before compiling (another process compiling meanwhile)
COMPILER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    import localinfer.backends.numba_cpu  # noqa: F401
    from localinfer.backends.numba_cpu import compile_claims
    from localinfer.backends.numba_cpu.cache_load import lazy_refresh
    lazy_refresh()
    hold = float(os.environ.get("HOLD", "0"))
    compile_claims.skip_claimed(os.environ.get("SKIP") == "1")

    def on_compile(cache):
        if hold:
            print("claimed", flush=True)
            time.sleep(hold)

    compile_claims.on_compile = on_compile
    from kmod import kernel
    try:
        result = kernel(20)
    except Exception as exc:
        result = type(exc).__name__
    s = kernel.stats
    print(json.dumps({"result": result, "hits": sum(s.cache_hits.values()),
                      "misses": sum(s.cache_misses.values())}), flush=True)
""")


def _compiler(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    full = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), **env}
    return subprocess.Popen([sys.executable, "-c", COMPILER, str(tmp_path)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_a_claimed_entry_is_waited_for_and_loaded_or_skipped(tmp_path: Path) -> None:
    (tmp_path / "kmod.py").write_text(KERNEL)
    holder = _compiler(tmp_path, HOLD="3")
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "claimed"
    # while the holder has the claim: a helper skips the entry, a step waits for it
    skipper = _compiler(tmp_path, SKIP="1")
    t0 = time.monotonic()
    waiter = _compiler(tmp_path)
    skipped = _report(skipper)
    assert skipped["result"] == "ClaimedElsewhere" and skipped["misses"] == 0
    waited = _report(waiter)
    held = _report(holder)
    assert held == {"result": 41, "hits": 0, "misses": 1}  # compiled it
    # the waiter loaded the holder's entry instead of compiling its own
    assert waited == {"result": 41, "hits": 1, "misses": 0}
    assert time.monotonic() - t0 > 1.0


def test_a_dead_claimer_leaves_the_compile_to_the_waiter(tmp_path: Path) -> None:
    (tmp_path / "kmod.py").write_text(KERNEL)
    holder = _compiler(tmp_path, HOLD="60")
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "claimed"
    waiter = _compiler(tmp_path)
    time.sleep(0.5)
    holder.kill()  # its claim goes with it
    holder.communicate()
    assert _report(waiter) == {"result": 41, "hits": 0, "misses": 1}


COLD_STEP = textwrap.dedent("""
    import json, sys
    from numba.core import event
    compiled = []

    class Compiles(event.Listener):
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    event.register("numba:compile", Compiles())
    from localinfer import LLM, SamplingParams
    from localinfer.backends.numba_cpu import compile_ahead
    started = []
    start = compile_ahead.CompileAhead._start

    def spy(self):
        start(self)
        started.append([name for name, _ in self.jobs])

    compile_ahead.CompileAhead._start = spy
    llm = LLM(sys.argv[1], backend="numba", threads=2)
    out = llm.generate(["hello world"], SamplingParams(max_tokens=6, temperature=0))[0]
    print(json.dumps({"tokens": out.token_ids, "compiled": compiled, "helper": started}))
""")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_cold_step_loads_the_kernels_its_helper_compiled(tmp_path: Path, arch: str) -> None:
    """An empty kernel cache: the helper compiles the attention (then, for the llama, the
    head's 8-bit projection) while the step compiles its first projection; the step loads
    the attention from the cache (its types match the helper's driver) and decodes what a
    warm process does."""
    from localinfer import LLM, SamplingParams

    if arch == "llama":
        path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=QT.Q4_1,
                                embd_type=QT.Q8_0, n_embd=128, n_ff=256)
        jobs = ["attend_job", "project_job"]
    else:  # f32 weights: every projection has the same types
        path = write_tiny_gemma3(tmp_path / "tiny.gguf")
        jobs = ["attend_job"]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "LOCALINFER_HOME": str(tmp_path / "home"), "LOCALINFER_WEIGHT_CACHE": "0"}
    env.pop("LOCALINFER_COMPILE_AHEAD", None)
    r = subprocess.run([sys.executable, "-c", COLD_STEP, str(path)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    cold = json.loads(r.stdout.strip().splitlines()[-1])
    assert cold["helper"] == [jobs]
    assert f"{arch}_step" in cold["compiled"]
    assert "attention_simd" not in cold["compiled"]  # loaded: the helper's
    warm = LLM(str(path), backend="numba", threads=2).generate(
        ["hello world"], SamplingParams(max_tokens=6, temperature=0))[0]
    assert cold["tokens"] == warm.token_ids


def test_no_helper_on_one_core_or_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from localinfer.backends.numba_cpu import compile_ahead

    jobs = [("project_job", (1,)), ("attend_job", (2,)), ("project_job", (1,))]
    ahead = compile_ahead.CompileAhead(jobs, None)
    assert ahead.jobs == [("attend_job", (2,))]  # deduplicated, the step's first call its own
    monkeypatch.setattr(compile_ahead, "_cores", lambda: 1)
    assert compile_ahead.CompileAhead(jobs, None)._payload is None
    monkeypatch.setattr(compile_ahead, "_cores", lambda: 2)
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert compile_ahead.CompileAhead(jobs, None)._payload is None
