"""The localinfer side: the real engine (LLM + LLMEngine, plan.backend), timed step by step.

Prefix caching is off and every repetition uses fresh prompt ids, so each prompt is computed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.bench.plan import BenchPlan, prompt_ids, round_up
from localinfer.bench.progress import Stage
from localinfer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from localinfer.structured import StructuredOutput


@dataclass(slots=True)
class Drive:
    """Timings of one engine run: start, all sequences have a first token, all finished."""

    start: float
    all_first: float
    end: float
    tokens_after_first: int  # tokens sampled after every sequence had its first one
    tokens: int  # every token sampled, first ones included


def drive(engine: Any, prompts: list[list[int]], max_tokens: int,
          structured: StructuredOutput | None = None) -> Drive:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            structured=structured)
    start = time.perf_counter()
    ids = {engine.add_request(p, params) for p in prompts}
    waiting_first = set(ids)
    all_first = 0.0
    after = total = 0
    while engine.has_unfinished_requests():
        decoding = not waiting_first  # this whole step is in the decode phase
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.seq_id not in ids or not out.token_ids:
                continue
            total += len(out.token_ids)
            if out.seq_id in waiting_first:
                waiting_first.discard(out.seq_id)
            elif decoding:
                after += len(out.token_ids)
        if not waiting_first and not all_first:
            all_first = now
    return Drive(start, all_first, time.perf_counter(), after, total)


MAX_BATCHED = 512  # the engine's max_num_batched_tokens in every run here


def _kv_mb(plan: BenchPlan, tokens: int, max_seqs: int) -> float:
    """kv_cache_mb that gives a main pool of exactly `tokens` slots (16-token blocks).

    Where the runner keeps sliding-window layers in a pool of their own (gemma3 on the Numba
    backend), only the global layers get `tokens` slots; the sliding pool gets the blocks the
    engine sizes for max_seqs sequences (engine/sliding_window.py), not `tokens` of them."""
    from localinfer.backend import get_backend
    from localinfer.engine.sliding_window import pool_blocks_for
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    with open_gguf(plan.model) as g:
        config = ModelConfig.from_gguf(g, strict_arch=plan.backend == "numba")
    runner_cls = get_backend(plan.backend)
    per_token = runner_cls.kv_bytes_per_token(config)
    blocks = round_up(tokens, 16) // 16
    n_sliding = sum(config.swa_layers) if config.sliding_window > 0 else 0
    if not (0 < n_sliding < config.n_layers and runner_cls.sliding_window_pool):
        return (blocks + 0.5) * 16 * per_token / 2**20
    per_layer = per_token // config.n_layers
    g_block = 16 * per_layer * (config.n_layers - n_sliding)
    s_block = 16 * per_layer * n_sliding
    swa = pool_blocks_for(config.sliding_window, 16, max_seqs, MAX_BATCHED, blocks)
    # size_kv_pools then gives the global layers (budget - sliding pool) // g_block = blocks,
    # or, when the sliding pool is capped at `blocks`, both pools `blocks` (half a block spare)
    return (blocks * g_block + swa * s_block + g_block / 2) / 2**20


def load_llm(plan: BenchPlan, ctx: int, max_seqs: int) -> Any:
    from localinfer.llm import LLM

    options = ({"n_gpu_layers": plan.n_gpu_layers, "flash_attn": plan.flash_attn}
               if plan.backend == "llamacpp" else None)
    return LLM(plan.model, backend=plan.backend, threads=plan.threads, max_model_len=ctx,
               kv_cache_mb=_kv_mb(plan, ctx, max_seqs), max_num_seqs=max_seqs,
               max_num_batched_tokens=MAX_BATCHED, enable_prefix_caching=False,
               backend_options=options)


def single(plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    """Prefill pp512, decode tg128 (from position 16) and at position ~1000, TTFT."""
    stage.show("loading model")
    llm = load_llm(plan, plan.single_ctx, 4)
    eng, nv = llm.engine, llm.tokenizer.n_vocab
    stage.show("warm-up")
    drive(eng, [prompt_ids(nv, 64, 1)], 4)
    seed = 100
    res: dict[str, Any] = {"prefill_tps": [], "decode_tps": [], "decode_tps_pos": [],
                           "stream_tps": [], "ttft_s": []}
    for r in range(plan.pp_reps):
        stage.show(f"prefill pp{plan.pp_tokens} ({r + 1}/{plan.pp_reps})")
        d = drive(eng, [prompt_ids(nv, plan.pp_tokens, seed := seed + 1)], 1)
        res["prefill_tps"].append(plan.pp_tokens / (d.all_first - d.start))
    for r in range(plan.tg_reps):
        stage.show(f"decode tg{plan.tg_tokens} ({r + 1}/{plan.tg_reps})")
        d = drive(eng, [prompt_ids(nv, plan.tg_prompt, seed := seed + 1)], plan.tg_tokens + 1)
        res["decode_tps"].append(d.tokens_after_first / (d.end - d.all_first))
    for r in range(plan.tg_reps):
        stage.show(f"decode at position {plan.pos_prompt} ({r + 1}/{plan.tg_reps})")
        d = drive(eng, [prompt_ids(nv, plan.pos_prompt, seed := seed + 1)], plan.pos_tokens + 1)
        res["decode_tps_pos"].append(d.tokens_after_first / (d.end - d.all_first))
    for r in range(plan.tg_reps):
        stage.show(f"decode as `localinfer run` streams it ({r + 1}/{plan.tg_reps})")
        res["stream_tps"].append(stream_tps(llm, plan.tg_tokens, seed := seed + 1))
    for r in range(plan.ttft_reps):
        stage.show(f"TTFT, {plan.ttft_prompt}-token prompt ({r + 1}/{plan.ttft_reps})")
        d = drive(eng, [prompt_ids(nv, plan.ttft_prompt, seed := seed + 1)], 1)
        res["ttft_s"].append(d.all_first - d.start)
    llm.close()
    return {k: summarize(v) for k, v in res.items()}


STREAM_PROMPT = "Write a long story about a lighthouse keeper and a storm."


def stream_tps(llm: Any, tokens: int, seed: int) -> float:
    """Decode as a user of `localinfer run` sees it: a chat prompt through the model's template,
    the model's sampling settings (run's defaults), text streamed through LLM.stream with
    detokenization and stop checks; tok/s = tokens after the first / their wall time.  The
    engine rows above time the same steps greedy on random ids; this one checks that nothing
    between the engine and the user costs more (ignore_eos keeps the length fixed)."""
    from localinfer.sampling_defaults import SamplingDefaults

    params = SamplingDefaults.from_metadata(llm.gguf.metadata).params(
        max_tokens=tokens + 1, seed=seed, ignore_eos=True)
    first = last = 0.0
    n = 0
    for out in llm.stream([{"role": "user", "content": STREAM_PROMPT}], params):
        if not out.token_ids:
            continue
        last = time.perf_counter()
        if not first:
            first = last
        else:
            n += len(out.token_ids)
    return n / max(last - first, 1e-9)


def batch(plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    """Aggregate decode: N sequences added at once through the scheduler."""
    stage.show("loading model")
    llm = load_llm(plan, plan.batch_ctx, max(plan.agg_counts))
    eng, nv = llm.engine, llm.tokenizer.n_vocab
    stage.show("warm-up")
    drive(eng, [prompt_ids(nv, plan.agg_prompt, 2 + i) for i in range(4)], 4)
    res: dict[str, Any] = {}
    for n in plan.agg_counts:
        stage.show(f"aggregate decode, {n} x {plan.agg_tokens} tokens")
        prompts = [prompt_ids(nv, plan.agg_prompt, 1000 * n + i) for i in range(n)]
        d = drive(eng, prompts, plan.agg_tokens)
        res[f"aggregate_tps_{n}"] = summarize([d.tokens_after_first / (d.end - d.all_first)])
        res[f"aggregate_e2e_tps_{n}"] = n * plan.agg_tokens / (d.end - d.start)
    llm.close()
    return res


def summarize(samples: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "samples": samples}
