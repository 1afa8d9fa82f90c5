"""`localinfer bench --speculative ngram`: decode speed with and without speculation, one model.

Four workloads, greedy, so both sides generate the same tokens (checked): editing code given
in the prompt (the reply mostly repeats it), answering from a passage given in the prompt,
free story writing, and writing new code (what a draft model is for). Each is decoded single
stream plain and with speculation; then `streams` requests of all four (numbered so no two
prompts are equal) run at once, as aggregate tok/s. One engine serves both sides, its
speculator unplugged for the plain runs, and the two alternate over ROUNDS rounds with the
best of each kept: on a small, noisy machine a plain run followed by a speculative one
measured drift as much as speculation. Reported: decode tok/s (first token to last), the
speed-up, and the acceptance.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localinfer.errors import LocalInferError

CODE = '''def summarize_orders(orders, tax_rate=0.2, discount=None):
    total = 0
    count = 0
    largest = None
    for order in orders:
        if order.get("cancelled"):
            continue
        price = order["price"] * order.get("quantity", 1)
        if discount is not None:
            price = price * (1 - discount)
        total += price
        count += 1
        if largest is None or price > largest:
            largest = price
    if count == 0:
        return {"total": 0, "count": 0, "average": 0, "largest": None}
    average = total / count
    taxed = total * (1 + tax_rate)
    report = {
        "total": round(total, 2),
        "taxed": round(taxed, 2),
        "count": count,
        "average": round(average, 2),
        "largest": round(largest, 2),
    }
    if total > 1000:
        report["tier"] = "gold"
    elif total > 500:
        report["tier"] = "silver"
    else:
        report["tier"] = "bronze"
    return report
'''
PASSAGE = (
    "The Rhine rises in the Swiss Alps and flows 1,230 kilometres to the North Sea. It forms "
    "part of the borders between Switzerland and Liechtenstein, Switzerland and Austria, "
    "Switzerland and Germany, and France and Germany. Basel, Strasbourg, Mannheim, Cologne "
    "and Rotterdam lie on its banks. Since Roman times it has been a vital waterway for "
    "trade, and today barges carry coal, grain, containers and chemicals along it. Its "
    "middle course, the Rhine Gorge between Bingen and Koblenz, is famous for its castles "
    "and vineyards and has been a UNESCO World Heritage Site since 2002. The river's flow is "
    "fed by Alpine snowmelt in summer and by rain in winter, which keeps it navigable all "
    "year.")
WORKLOADS = {
    "code edit": "Rename the variable `total` to `running_sum` in this function and add type "
                 "hints. Output only the full updated function.\n\n```python\n" + CODE + "```",
    "passage answer": PASSAGE + "\n\nUsing the passage above, list the cities on the Rhine "
                                "and what barges carry, quoting the passage where you can.",
    "story": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "code generation": "Write a Python class LRUCache with get and put methods, type hints "
                       "and docstrings, then unit tests for it with unittest.",
}
ROUNDS = 2


@dataclass(slots=True)
class SpecBench:
    model: str
    backend: str
    speculative: str
    num_speculative_tokens: int | None
    tokens: int
    streams: int
    rounds: int = ROUNDS
    rows: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        k = self.num_speculative_tokens
        lines = [f"localinfer bench --speculative {self.speculative}: {Path(self.model).name}, "
                 f"{self.backend} backend, K {k or 'default'}, greedy, up to {self.tokens} "
                 f"tokens, best of {self.rounds} alternating rounds",
                 f"  {'workload':<22} {'plain tok/s':>11} {'spec tok/s':>11} {'speed-up':>9}"
                 f" {'accepted':>9} {'per verif.':>10}"]
        for r in self.rows:
            lines.append(f"  {r['workload']:<22} {r['plain_tps']:11.1f} {r['spec_tps']:11.1f} "
                         f"{r['spec_tps'] / r['plain_tps']:8.2f}x {r['acceptance']:9.0%} "
                         f"{r['mean_accepted']:10.2f}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run(model: str | None, speculative: str, num_speculative_tokens: int | None,
        threads: int | None, backend: str, backend_options: dict[str, Any] | None,
        tokens: int, streams: int, rounds: int = ROUNDS) -> SpecBench:
    from localinfer.llm import LLM

    llm = LLM(model, backend=backend, threads=threads, max_num_seqs=max(streams, 1),
              backend_options=backend_options, speculative=speculative,
              num_speculative_tokens=num_speculative_tokens)
    try:
        bench = SpecBench(str(llm.path), backend, speculative, num_speculative_tokens, tokens,
                          streams, rounds)
        bench.rows = _measure(llm, tokens, streams, rounds)
    finally:
        llm.close()
    return bench


def _measure(llm: Any, tokens: int, streams: int, rounds: int) -> list[dict[str, Any]]:
    """One row per workload alone, then `streams` of them at once: the best of `rounds`
    plain/speculative pairs (the order flips each round, so drift favours neither side)."""
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    speculator = llm.engine.scheduler.speculator
    llm.generate("Hi", SamplingParams(max_tokens=2))  # kernels compiled or loaded first
    jobs = [(name, 1) for name in WORKLOADS] + ([("streams", streams)] if streams > 1 else [])
    rows = []
    try:
        for name, n in jobs:
            best = {"plain": 0.0, "spec": 0.0}
            proposed = accepted = verifications = n_tokens = 0
            for r in range(rounds):
                prompts = _prompts(llm, name, n, r)
                ids: dict[str, list[list[int]]] = {}
                for mode in ("plain", "spec") if r % 2 == 0 else ("spec", "plain"):
                    # the plain engine is this one with its speculator unplugged between
                    # requests: the same weights, KV pool and kernels on both sides
                    llm.engine.scheduler.speculator = speculator if mode == "spec" else None
                    # both sides prefill cold: the second run of a round's prompts would
                    # otherwise find them in the prefix cache
                    llm.engine.block_manager.reset_prefix_cache()
                    before = llm.engine.stats()
                    tps, ids[mode] = _decode(llm, prompts, params)
                    best[mode] = max(best[mode], tps)
                    if mode == "spec":
                        after = llm.engine.stats()
                        proposed += after.spec_proposed_tokens - before.spec_proposed_tokens
                        accepted += after.spec_accepted_tokens - before.spec_accepted_tokens
                        verifications += after.spec_verifications - before.spec_verifications
                if ids["spec"] != ids["plain"]:
                    raise LocalInferError(
                        f"bench: speculative tokens differ from plain ones ({name})")
                n_tokens = sum(len(t) for t in ids["plain"])
            rows.append({"workload": name if n == 1 else f"{n} streams, mixed",
                         "plain_tps": best["plain"], "spec_tps": best["spec"],
                         "acceptance": accepted / proposed if proposed else 0.0,
                         "mean_accepted": accepted / verifications if verifications else 0.0,
                         "tokens": n_tokens})
    finally:
        llm.engine.scheduler.speculator = speculator
    return rows


def _prompts(llm: Any, name: str, n: int, round_: int) -> list[Any]:
    if n == 1:  # a repeat finds its prompt in the prefix cache: decode tok/s leaves it out
        return [llm.request(WORKLOADS[name])]
    # every round's prompts start differently, so no round reuses another's prefill
    names = list(WORKLOADS)
    return [llm.request(f"Round {round_ + 1}, request {i + 1}. " + WORKLOADS[names[i % len(names)]])
            for i in range(n)]


def _decode(llm: Any, prompts: list[Any], params: Any) -> tuple[float, list[list[int]]]:
    """Decode tok/s (one prompt: first token to last; several: all tokens over the wall time,
    prefill included) and the token ids."""
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    ids = [r.token_ids for r in results]
    if len(results) == 1:
        return results[0].decode_tps, ids
    return sum(len(t) for t in ids) / elapsed, ids
