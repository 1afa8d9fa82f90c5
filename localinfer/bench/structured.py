"""The structured-output group (`localinfer bench --structured`): what a constraint costs.

localinfer only: llama.cpp has no comparable path, so its column stays empty. Everything is
measured on one engine in one child process:

- mask time added per sequence-step: `MaskStats.per_seq_step` over the constrained decode runs,
  i.e. what the engine thread spends on masks beyond the forward pass (waiting for a fill that
  is not done yet, applying it, advancing the matcher);
- first mask of a new schema: compile (`GuideFactory.prepare`) plus one mask fill, the latency
  a request with a never-seen schema pays before its first token can be sampled;
- the llguidance tokenizer build, once per model, on its own row (excluded from the above);
- constrained vs unconstrained decode at 1 and 16 sequences, the same token count on both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from localinfer.bench.plan import STRUCTURED_COUNTS, BenchPlan, prompt_ids
from localinfer.bench.progress import Stage
from localinfer.bench.runner_ours import drive, load_llm, summarize
from localinfer.structured import StructuredOutput

# An array that cannot close within any budget here (minItems 1000): EOS stays masked, so a
# constrained sequence runs to max_tokens exactly like an unconstrained one with ignore_eos,
# and both sides decode the same number of tokens. Its items are a typical record (what a
# pydantic model gives: no length bounds); a string `maxLength` makes llguidance's masks ~6x
# costlier (it counts in the lexer) — measure your own with --structured-schema FILE.
ENDLESS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"type": "object",
              "properties": {"id": {"type": "integer"},
                             "name": {"type": "string"},
                             "role": {"enum": ["admin", "editor", "guest"]},
                             "active": {"type": "boolean"},
                             "tags": {"type": "array", "items": {"type": "string"},
                                      "maxItems": 3}},
              "required": ["id", "name", "role", "active", "tags"],
              "additionalProperties": False},
    "minItems": 1000,
}


def fresh_schema(i: int) -> dict[str, Any]:
    """A typical request schema whose grammar text no earlier one shares (the property name
    carries `i`), so the prototype cache cannot help and each repetition compiles."""
    props: dict[str, Any] = {
        f"id_{i}": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "score": {"type": "number"},
        "status": {"enum": ["active", "inactive", "pending"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"]},
    }
    return {"type": "object", "properties": props, "required": list(props)}


def first_masks(engine: Any, reps: int) -> list[float]:
    """Seconds from a never-seen schema to its first token mask, per repetition."""
    import llguidance.numpy as llnp

    bitmask = llnp.allocate_token_bitmask(1, engine.guides.ll_tokenizer.vocab_size)
    out = []
    for r in range(reps):
        spec = StructuredOutput(json=fresh_schema(r))
        t0 = time.perf_counter()
        proto = engine.guides.prepare(spec)  # schema -> grammar -> compiled matcher
        matcher = proto.deep_copy()  # what add_request does for each sequence
        llnp.fill_next_token_bitmask(matcher, bitmask)
        out.append(time.perf_counter() - t0)
    return out


def _added(samples: list[float]) -> dict[str, Any]:
    return {"mean": statistics.fmean(samples), "p99": float(np.percentile(samples, 99)),
            "n": len(samples)} if samples else {"mean": None, "p99": None, "n": 0}


def run(plan: BenchPlan, stage: Stage) -> dict[str, Any]:
    stage.show("loading model")
    n_max = max(STRUCTURED_COUNTS)
    llm = load_llm(plan, plan.structured_ctx, n_max)
    eng, nv = llm.engine, llm.tokenizer.n_vocab
    stage.show("llguidance tokenizer")
    t0 = time.perf_counter()
    eng.guides.ll_tokenizer  # noqa: B018  built on first access, cached for the model
    res: dict[str, Any] = {"ll_tokenizer_build_s": time.perf_counter() - t0}
    spec = StructuredOutput(json=plan.structured_schema or ENDLESS_SCHEMA)
    # both paths at the largest batch first: Numba JIT of the forward pass and of the mask
    # kernel, the masker's thread and buffers, the endless schema's prototype
    stage.show("warm-up")
    warm = [prompt_ids(nv, plan.agg_prompt, 2 + i) for i in range(n_max)]
    drive(eng, warm, 4)
    drive(eng, warm, 4, spec)
    stage.show(f"first mask of a new schema ({plan.mask_reps} schemas)")
    res["first_mask_s"] = summarize(first_masks(eng, plan.mask_reps))
    eng.constrained.masker.stats.reset()
    all_added: list[float] = []
    for n in STRUCTURED_COUNTS:
        tps: dict[str, list[float]] = {"structured": [], "unconstrained": []}
        added: list[float] = []
        produced = n * plan.agg_tokens
        for r in range(plan.structured_reps):
            prompts = [prompt_ids(nv, plan.agg_prompt, 5000 + 1000 * n + 100 * r + i)
                       for i in range(n)]
            # alternate which side goes first so neither always runs on a cooler machine; the
            # median over the pairs (3 by default) shrugs off one run hit by a burst of load
            order = ("unconstrained", "structured") if r % 2 == 0 else (
                "structured", "unconstrained")
            for side in order:
                stage.show(f"{side} decode, {n} x {plan.agg_tokens} tokens "
                           f"({r + 1}/{plan.structured_reps})")
                d = drive(eng, prompts, plan.agg_tokens,
                          spec if side == "structured" else None)
                tps[side].append(d.tokens_after_first / (d.end - d.all_first))
                if side == "structured":
                    produced = min(produced, d.tokens)
                    added += eng.constrained.masker.stats.per_seq_step
                    eng.constrained.masker.stats.reset()
        for side, samples in tps.items():
            res[f"{side}_tps_{n}"] = summarize(samples)
        res[f"structured_tokens_{n}"] = produced  # fewest over the repetitions
        res[f"expected_tokens_{n}"] = n * plan.agg_tokens
        res[f"mask_added_{n}"] = _added(added)
        all_added += added
    overall = _added(all_added)
    res["mask_added_mean_s"], res["mask_added_p99_s"] = overall["mean"], overall["p99"]
    llm.close()
    return res


def notes(raw: dict[str, Any] | None) -> list[str]:
    """Table notes: the mask time per sequence count (the rows pool them all), and any
    constrained run that stopped before max_tokens (the grammar finished or a matcher failed:
    not a like-for-like comparison then)."""
    raw = raw or {}
    out = []
    per = [(n, raw.get(f"mask_added_{n}") or {}) for n in STRUCTURED_COUNTS]
    if all(a.get("mean") is not None for _, a in per):
        out.append("structured: mask added per sequence-step, mean / p99 (ms): " + ", ".join(
            f"{n} seq {a['mean'] * 1e3:.3f} / {a['p99'] * 1e3:.3f}" for n, a in per))
    for n in STRUCTURED_COUNTS:
        got, want = raw.get(f"structured_tokens_{n}"), raw.get(f"expected_tokens_{n}")
        if got is not None and want is not None and got < want:
            out.append(f"structured decode, {n} sequence{'s' if n > 1 else ''}: only {got} "
                       f"of {want} tokens, not a like-for-like comparison")
    return out
