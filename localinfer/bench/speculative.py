"""`localinfer bench --speculative ngram`: decode speed with and without speculation, one model.

Three workloads, greedy, so both sides generate the same tokens (checked): editing code given
in the prompt (the reply mostly repeats it), answering from a passage given in the prompt,
and free story writing. Each is decoded single stream with the engine plain, then with
speculation; then `streams` requests of all three (numbered so no two prompts are equal) run
at once, as aggregate tok/s. Both engines are loaded in this process one after the other,
with the same sizes. Reported: decode tok/s (first token to last), the speed-up, and the
speculative engine's acceptance. One run of a small, noisy machine: compare the ratios.
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
}


@dataclass(slots=True)
class SpecBench:
    model: str
    backend: str
    speculative: str
    num_speculative_tokens: int | None
    tokens: int
    streams: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        k = self.num_speculative_tokens
        lines = [f"localinfer bench --speculative {self.speculative}: {Path(self.model).name}, "
                 f"{self.backend} backend, K {k or 'default'}, greedy, up to {self.tokens} "
                 "tokens (one run: compare the ratios)",
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
        tokens: int, streams: int) -> SpecBench:
    from localinfer.llm import LLM

    results: dict[str, dict[str, tuple[float, list[list[int]]]]] = {}
    stats: dict[str, tuple[float, float]] = {}
    path = ""
    for mode in ("plain", "spec"):
        spec = {"speculative": speculative, "num_speculative_tokens": num_speculative_tokens}
        llm = LLM(model, backend=backend, threads=threads, max_num_seqs=max(streams, 1),
                  backend_options=backend_options, **(spec if mode == "spec" else {}))
        try:
            path = str(llm.path)
            results[mode] = _measure(llm, tokens, streams, stats, mode)
        finally:
            llm.close()
    bench = SpecBench(path, backend, speculative, num_speculative_tokens, tokens, streams)
    for name, (plain_tps, plain_ids) in results["plain"].items():
        spec_tps, spec_ids = results["spec"][name]
        if spec_ids != plain_ids:
            raise LocalInferError(f"bench: speculative tokens differ from plain ones ({name})")
        acceptance, mean = stats[name]
        bench.rows.append({"workload": name, "plain_tps": plain_tps, "spec_tps": spec_tps,
                           "acceptance": acceptance, "mean_accepted": mean,
                           "tokens": sum(len(ids) for ids in plain_ids)})
    return bench


def _measure(llm: Any, tokens: int, streams: int, stats: dict[str, tuple[float, float]],
             mode: str) -> dict[str, tuple[float, list[list[int]]]]:
    """name -> (decode tok/s, token ids) for each workload alone, then all at once."""
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    llm.generate("Hi", SamplingParams(max_tokens=2))  # kernels compiled or loaded first
    out: dict[str, tuple[float, list[list[int]]]] = {}
    for name, prompt in WORKLOADS.items():
        before = llm.engine.stats()
        result = llm.generate(llm.request(prompt), params)[0]
        out[name] = (result.decode_tps, [result.token_ids])
        _tally(stats, name, before, llm.engine.stats(), mode)
    if streams > 1:
        names = list(WORKLOADS)
        prompts = [llm.request(f"Request {i + 1}. " + WORKLOADS[names[i % len(names)]])
                   for i in range(streams)]
        before = llm.engine.stats()
        start = time.perf_counter()
        batch = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        name = f"{streams} streams, mixed"
        out[name] = (sum(len(r.token_ids) for r in batch) / elapsed,
                     [r.token_ids for r in batch])
        _tally(stats, name, before, llm.engine.stats(), mode)
    return out


def _tally(stats: dict[str, tuple[float, float]], name: str, before: Any, after: Any,
           mode: str) -> None:
    if mode != "spec":
        return
    proposed = after.spec_proposed_tokens - before.spec_proposed_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    verifications = after.spec_verifications - before.spec_verifications
    stats[name] = (accepted / proposed if proposed else 0.0,
                   accepted / verifications if verifications else 0.0)
