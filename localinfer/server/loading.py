"""Load the model on a background thread, so the socket is up (and /health answers 503)
while weights load and kernels compile; then warm up once and flip to ready."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from localinfer.server.state import ServerState

log = logging.getLogger("localinfer.server")


def start_loading(state: ServerState, on_error: Callable[[], None] | None = None) -> None:
    thread = threading.Thread(target=_load, args=(state, on_error),
                              name="localinfer-load", daemon=True)
    thread.start()


def _load(state: ServerState, on_error: Callable[[], None] | None) -> None:
    from localinfer.engine.engine_loop import EngineLoop
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    cfg = state.config
    start = time.perf_counter()
    try:
        llm = LLM(state.model_path or cfg.model, backend=cfg.backend, threads=cfg.threads,
                  max_model_len=cfg.max_model_len, kv_cache_mb=cfg.kv_cache_mb,
                  max_num_seqs=cfg.max_num_seqs,
                  max_num_batched_tokens=cfg.max_num_batched_tokens,
                  enable_prefix_caching=cfg.enable_prefix_caching,
                  backend_options=cfg.backend_options, **cfg.speculative)
        state.llm = llm
        state.model_path = llm.path
        loop = EngineLoop(llm.engine, max_queue=cfg.max_queue).start()
        if cfg.warmup:  # compile (or load from cache) every kernel before the first request
            params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
            for _ in loop.submit(llm.encode("Hello"), params):
                pass
        state.metrics.watch_engine(
            lambda: (loop.stats(), loop.num_queued, state.in_flight))
        state.loop = loop
        if cfg.warmup:
            # llguidance's view of the vocabulary (~1 s for 151k tokens) and the mask kernel,
            # beside serving rather than before it: the first constrained request waits for
            # whatever is not done yet, unconstrained ones never do
            threading.Thread(target=_warm_structured, args=(llm,),
                             name="localinfer-warm", daemon=True).start()
    except Exception as exc:
        log.exception("loading the model failed")
        state.load_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if on_error is not None:
            on_error()
        return
    log.info("model %s ready in %.1f s (context %d tokens, %d KV blocks)", state.model_id,
             time.perf_counter() - start, llm.engine.max_model_len,
             llm.engine.block_manager.num_blocks)


def _warm_structured(llm: Any) -> None:
    try:
        llm.engine.guides.warm_up()
    except Exception:  # the first constrained request reports it
        log.exception("warming up structured output failed")
