"""The llama.cpp side, through llama-cpp-python in this process.

Single stream: `llama_cpp.Llama(...).eval()` as llama.cpp's own examples time it, with greedy
argmax on the returned logits so both sides feed back what they sampled. Aggregate: the
low-level API with one sequence id per stream, a unified KV cache and one llama_decode per step
(the way llama-server batches its slots).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from localinfer.bench.plan import BenchPlan, prompt_ids
from localinfer.bench.progress import Stage
from localinfer.bench.runner_ours import summarize


def _quiet() -> Any:
    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)
    return llama_cpp


def last_argmax(llm: Any) -> int:
    """Greedy token from the logits of the last evaluated token (Llama.eval keeps no copy of
    them unless logits_all, so they are read from the context)."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())


def single(plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    llama_cpp = _quiet()
    stage.show("loading model")
    llm = llama_cpp.Llama(model_path=plan.model, n_ctx=plan.single_ctx, n_batch=512,
                          n_ubatch=512, n_threads=plan.threads, n_threads_batch=plan.threads,
                          verbose=False)
    nv = llm.n_vocab()

    def prompt(ids: list[int]) -> int:
        llm.reset()
        llm.eval(ids)
        return last_argmax(llm)

    def decode(tok: int, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([tok])
            tok = last_argmax(llm)
        return n / (time.perf_counter() - t0)

    stage.show("warm-up")
    decode(prompt(prompt_ids(nv, 64, 1)), 4)
    seed = 100
    res: dict[str, list[float]] = {"prefill_tps": [], "decode_tps": [], "decode_tps_pos": [],
                                   "ttft_s": []}
    for r in range(plan.pp_reps):
        stage.show(f"prefill pp{plan.pp_tokens} ({r + 1}/{plan.pp_reps})")
        t0 = time.perf_counter()
        prompt(prompt_ids(nv, plan.pp_tokens, seed := seed + 1))
        res["prefill_tps"].append(plan.pp_tokens / (time.perf_counter() - t0))
    for r in range(plan.tg_reps):
        stage.show(f"decode tg{plan.tg_tokens} ({r + 1}/{plan.tg_reps})")
        tok = prompt(prompt_ids(nv, plan.tg_prompt, seed := seed + 1))
        res["decode_tps"].append(decode(tok, plan.tg_tokens))
    for r in range(plan.tg_reps):
        stage.show(f"decode at position {plan.pos_prompt} ({r + 1}/{plan.tg_reps})")
        tok = prompt(prompt_ids(nv, plan.pos_prompt, seed := seed + 1))
        res["decode_tps_pos"].append(decode(tok, plan.pos_tokens))
    for r in range(plan.ttft_reps):
        stage.show(f"TTFT, {plan.ttft_prompt}-token prompt ({r + 1}/{plan.ttft_reps})")
        t0 = time.perf_counter()
        prompt(prompt_ids(nv, plan.ttft_prompt, seed := seed + 1))
        res["ttft_s"].append(time.perf_counter() - t0)
    llm.close()
    return {k: summarize(v) for k, v in res.items()}


class _Batched:
    """A llama.cpp context for many sequences and a llama_batch to feed it."""

    def __init__(self, plan: BenchPlan) -> None:
        lc = self.lc = _quiet()
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(plan.model.encode(),
                                                   lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {plan.model}")
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = plan.batch_ctx, 512, 512
        cp.n_seq_max = self.n_seq_max = max(plan.agg_counts)
        cp.n_threads = cp.n_threads_batch = plan.threads
        cp.kv_unified = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(512, 0, 1)

    def decode(self, items: list[tuple[int, int, int, bool]]) -> list[int]:
        """items: (token, position, seq id, wants logits); argmax for each wanted row."""
        b = self.batch
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0], b.logits[i] = seq, int(out)
        b.n_tokens = len(items)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed (KV cache full?)")
        n_out = sum(1 for it in items if it[3])
        ptr = self.lc.llama_get_logits(self.ctx)
        arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                    shape=(n_out, self.n_vocab))
        return [int(t) for t in arr.argmax(axis=1)]

    def run(self, prompts: list[list[int]], max_tokens: int) -> float:
        """All prompts, then max_tokens - 1 decode steps; aggregate decode tok/s."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        items = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(prompts)
                 for p, t in enumerate(ids)]
        last: list[int] = []
        for i in range(0, len(items), 512):
            last += self.decode(items[i:i + 512])
        pos = [len(p) for p in prompts]
        t0 = time.perf_counter()
        for _ in range(max_tokens - 1):
            last = self.decode([(t, pos[s], s, True) for s, t in enumerate(last)])
            pos = [p + 1 for p in pos]
        return len(prompts) * (max_tokens - 1) / (time.perf_counter() - t0)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def batch(plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    stage.show("loading model")
    b = _Batched(plan)
    stage.show("warm-up")
    # no more sequences than the context has seq ids (--aggregate 3,2 makes three)
    b.run([prompt_ids(b.n_vocab, plan.agg_prompt, 2 + i) for i in range(min(4, b.n_seq_max))], 4)
    res: dict[str, Any] = {}
    for n in plan.agg_counts:
        stage.show(f"aggregate decode, {n} x {plan.agg_tokens} tokens")
        prompts = [prompt_ids(b.n_vocab, plan.agg_prompt, 1000 * n + i) for i in range(n)]
        res[f"aggregate_tps_{n}"] = summarize([b.run(prompts, plan.agg_tokens)])
    b.close()
    return res
