"""CompileAhead: a second process compiles part of a new step's kernels while the first runs.

A model's first step on a new machine compiles every kernel it calls, one after the other, on
one core: Numba holds one compiler lock per process and LLVM runs single-threaded (SmolLM2 on
2 cores: 23 s of compile, the other core idle).  The step's kernels are separate cached
functions (matmul_tiles per weight kind, attention_simd, ...), so a helper process can compile
some of them into the same NUMBA_CACHE_DIR meanwhile; the step then loads them from the cache
instead of compiling them.  compile_claims.py keeps the two from compiling the same entry: the
step waits for an entry the helper is compiling, and the helper skips one the step has started.

The helper gets the step's kernel calls as jobs: a small driver (below) that makes the same
call with arguments of the same Numba types as the step's, and those types (pickled).  While
the step compiles its first call, the helper takes the second, then works from the step's
last call backwards, so the two meet once; a job whose kernel the step has claimed is
skipped.  A driver that drifts from the step's calls only costs time: its kernel gets other
types, and the step compiles its own (never a wrong result; tests/test_compile_ahead.py
checks that the step loads the helper's attention).  The helper starts with the first kernel
the step is about to compile, so a step whose kernels are all cached never starts one, and it
is stopped when the step returns.  `LOCALINFER_COMPILE_AHEAD=0` turns it off; it is off on
one core.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
from numba import njit

from .dispatch import attend
from .project_q8k import project_as

ENV = "LOCALINFER_COMPILE_AHEAD"


@njit(nogil=True)
def project_job(isa, ws, layer, x, qbuf, out, q8k):
    """The steps' project_as calls (every role's x and out are (n, cols) f32 rows)."""
    project_as(isa, ws, layer, x, qbuf, out, q8k, 0)


@njit(nogil=True)
def attend_job(isa, qkv, dims, positions, token_seq, block_tables, slot_mapping, k_pool, v_pool,
               scale, scratch, out):
    """llama_step's and gemma3_step's attend calls, for layer 0 of the pools."""
    n_layers, n_embd, n_heads, n_kv, head_dim, n_ff, rope_dim, block_size, neox = dims
    layer = n_layers - n_layers
    attend(isa, qkv, n_heads, n_kv, head_dim, positions, token_seq, block_tables, block_size,
           slot_mapping, k_pool[layer], v_pool[layer], scale, scratch, out, 0)


DRIVERS = {"project_job": project_job, "attend_job": attend_job}
Job = tuple[str, tuple]  # (driver name, its Numba argument types)


def step_jobs(step_py_func: Any, args: tuple) -> list[Job]:
    """The jobs of a call of llama_step or gemma3_step (step_py_func) with args, in the order
    the step makes the calls: QKV projection, attention, output, gate/up and down
    projections, head (gemma3's local and global attention calls have the same types)."""
    import inspect

    from numba import typeof
    from numba.core.typing.typeof import Purpose

    a = dict(zip(inspect.signature(step_py_func).parameters, args, strict=True))
    if "k_global" in a:  # gemma3_step: llama's buffers first, scale 1 (Q is pre-scaled)
        bufs = a["bufs"][0]
        kv = (a["tables"], a["slots"], a["k_global"], a["v_global"], np.float32(1.0))
    else:
        bufs = a["bufs"]
        kv = (a["block_tables"], a["slot_mapping"], a["k_pool"], a["v_pool"], a["attn_scale"])
    rows = bufs[1]  # (n, n_embd) f32: the type of every projection's x and out
    tables, slots, k_pool, v_pool, scale = kv

    def sig(*values: Any) -> tuple:
        return tuple(typeof(v, Purpose.argument) for v in values)

    def project(ws: Any) -> Job:
        return ("project_job", sig(a["isa"], ws, np.int64(0), rows, bufs[9], rows, a["q8k"]))

    attention = ("attend_job", sig(a["isa"], bufs[2], a["dims"], a["positions"],
                                   a["token_seq"], tables, slots, k_pool, v_pool, scale,
                                   bufs[8], bufs[3]))
    return [project(a["wqkv"]), attention, project(a["wo"]), project(a["wgu"]),
            project(a["wdown"]), project(a["head"])]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class CompileAhead:
    """Around a step that may compile: `with CompileAhead(step_jobs(step, args), step):
    step(*args)`; the helper process starts at the first kernel the step compiles."""

    def __init__(self, jobs: Sequence[Job], step_py_func: Any) -> None:
        unique: list[Job] = []
        for job in jobs:
            if job not in unique:
                unique.append(job)
        # the step compiles its first call meanwhile: the helper takes the second, then works
        # backwards from the last, so the two meet once instead of the step catching up
        # with the helper (and waiting for it) at every call
        self.jobs = unique[1:2] + unique[:1:-1]
        self._step = step_py_func
        self._payload: bytes | None = None
        self.process: subprocess.Popen[bytes] | None = None
        enabled = os.environ.get(ENV, "1") != "0" and _cores() > 1
        if enabled and self.jobs:
            try:
                self._payload = pickle.dumps(self.jobs)
            except Exception:  # a type that does not pickle: no helper, the same compile
                self._payload = None

    def __enter__(self) -> CompileAhead:
        from . import compile_claims

        if self._payload is not None:
            compile_claims.on_compile = self._on_compile
        return self

    def _on_compile(self, cache: Any) -> None:
        from . import compile_claims

        if cache._py_func is self._step:  # the step itself: its kernels may all be cached
            return
        compile_claims.on_compile = None
        self._start()

    def _start(self) -> None:
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert self.process.stdin is not None and self._payload is not None
            self.process.stdin.write(self._payload)
            self.process.stdin.close()
        except OSError:  # the step compiles everything itself, as without a helper
            self.process = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        from . import compile_claims

        if compile_claims.on_compile == self._on_compile:
            compile_claims.on_compile = None
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the step is compiled: what the helper still does is waste
            proc.wait()


def _type_only(driver: Any, sig: tuple) -> None:
    """Type-infer driver for sig, which compiles every kernel it calls (into the cache), but
    not the driver itself: its lowering would generate the kernels' code once more.  Falls
    back to the whole compile where Numba's internals differ."""
    try:
        from numba.core.compiler import run_frontend
        from numba.core.registry import cpu_target
        from numba.core.typed_passes import type_inference_stage
    except ImportError:
        driver.compile(sig)
        return
    typing, target = cpu_target.typing_context, cpu_target.target_context
    typing.refresh()
    target.refresh()
    type_inference_stage(typing, target, run_frontend(driver.py_func), sig, None)


def _serve() -> None:
    """The helper: compile each job's driver, skipping those whose kernels are claimed."""
    from . import compile_claims
    from .cache_load import lazy_refresh

    jobs: list[Job] = pickle.loads(sys.stdin.buffer.read())
    parent = os.getppid()
    lazy_refresh()
    compile_claims.skip_claimed(True)
    for name, sig in jobs:
        if os.getppid() != parent:
            return
        try:
            _type_only(DRIVERS[name], sig)
        except Exception:  # claimed by the step (ClaimedElsewhere, maybe wrapped) or drifted
            continue


if __name__ == "__main__":
    _serve()
