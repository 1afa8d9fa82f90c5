"""`localinfer bench --speculative ngram`: decode speed with and without speculation, one model.

Four workloads, greedy, so both sides generate the same tokens (checked): editing code given
in the prompt (the reply mostly repeats it), answering from a passage given in the prompt,
free story writing, and writing new code (what a draft model is for). Each is decoded single
stream plain and with speculation; then `streams` requests of all four (numbered so no two
prompts are equal) run at once, as aggregate tok/s.

The two sides run in lockstep: two engines on the same mapped weights (one with the
speculator), stepped alternately (the first to go flips every step), each side's time the sum
of its own steps. A small shared machine's speed moves by 20% from one minute to the next, in
both directions (a 16-stream plain run gave 140 to 202 tok/s within one bench on 2 cores;
with speculation switched off, spec/plain ratios of back-to-back runs spread 0.83-1.21): runs
one after the other measured the machine as much as speculation, while steps 50 ms apart meet
the same machine. Reported: decode tok/s on each side's own clock (one prompt: first token to
last; several: all tokens over all steps, prefill included), the speed-up, the acceptance.
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
                 f"tokens, {self.rounds} rounds in lockstep",
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

    def open_llm(spec: str | None) -> LLM:
        return LLM(model, backend=backend, threads=threads, max_num_seqs=max(streams, 1),
                   backend_options=backend_options, speculative=spec,
                   num_speculative_tokens=num_speculative_tokens if spec else None)

    spec_llm = open_llm(speculative)
    try:
        plain_llm = open_llm(None)  # the weights' pages are the first engine's (mapped)
        try:
            bench = SpecBench(str(spec_llm.path), backend, speculative, num_speculative_tokens,
                              tokens, streams, rounds)
            bench.rows = _measure(plain_llm, spec_llm, tokens, streams, rounds)
        finally:
            plain_llm.close()
    finally:
        spec_llm.close()
    return bench


class _Side:
    """One engine's requests of a round, stepped from outside, timed by its own steps."""

    def __init__(self, llm: Any, prompts: list[Any], params: Any) -> None:
        self.engine = llm.engine
        self.engine.block_manager.reset_prefix_cache()  # every round prefills cold
        self.ids = [self.engine.add_request(llm.encode(p), params) for p in prompts]
        self.tokens: dict[int, list[int]] = {i: [] for i in self.ids}
        self.clock = 0.0  # seconds spent in this side's steps
        self.first: dict[int, float] = {}  # clock at a request's first token
        self.last: dict[int, float] = {}

    def step(self) -> None:
        t = time.perf_counter()
        outputs = self.engine.step()
        self.clock += time.perf_counter() - t
        for out in outputs:
            if out.error is not None or out.finish_reason == "abort":
                raise LocalInferError(f"bench: a request failed ({out.error})")
            if out.token_ids and out.seq_id in self.tokens:
                self.tokens[out.seq_id].extend(out.token_ids)
                self.first.setdefault(out.seq_id, self.clock)
                self.last[out.seq_id] = self.clock

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    def decode(self) -> tuple[int, float]:
        """(tokens, seconds) of the round: one request from its first token to its last;
        several, every token over every step (prefill included)."""
        if len(self.ids) == 1:
            i = self.ids[0]
            return len(self.tokens[i]) - 1, self.last[i] - self.first[i]
        return sum(len(t) for t in self.tokens.values()), self.clock


def _lockstep(plain: _Side, spec: _Side) -> None:
    """Step both sides alternately until both are done, the first to go flipping each time
    (whatever one step leaves in the caches for the next favours neither side)."""
    order = [plain, spec]
    while plain.busy or spec.busy:
        for side in order:
            if side.busy:
                side.step()
        order.reverse()


def _measure(plain_llm: Any, spec_llm: Any, tokens: int, streams: int,
             rounds: int) -> list[dict[str, Any]]:
    """One row per workload alone, then `streams` of them at once, each over `rounds`
    rounds in lockstep (tokens and seconds summed over the rounds)."""
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    for llm in (plain_llm, spec_llm):
        llm.generate("Hi", SamplingParams(max_tokens=2))  # kernels compiled or loaded first
    jobs = [(name, 1) for name in WORKLOADS] + ([("streams", streams)] if streams > 1 else [])
    rows = []
    for name, n in jobs:
        done = {"plain": [0, 0.0], "spec": [0, 0.0]}  # tokens, seconds over the rounds
        before = spec_llm.engine.stats()
        n_tokens = 0
        for r in range(rounds):
            prompts = _prompts(spec_llm, name, n, r)  # the same model: the same prompts
            sides = {"plain": _Side(plain_llm, prompts, params),
                     "spec": _Side(spec_llm, prompts, params)}
            _lockstep(sides["plain"], sides["spec"])
            ids = {mode: [side.tokens[i] for i in side.ids] for mode, side in sides.items()}
            if ids["spec"] != ids["plain"]:
                raise LocalInferError(f"bench: speculative tokens differ from plain ones ({name})")
            for mode, side in sides.items():
                k, seconds = side.decode()
                done[mode][0] += k
                done[mode][1] += seconds
            n_tokens = sum(len(t) for t in ids["plain"])
        after = spec_llm.engine.stats()
        proposed = after.spec_proposed_tokens - before.spec_proposed_tokens
        accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
        verifications = after.spec_verifications - before.spec_verifications
        rows.append({"workload": name if n == 1 else f"{n} streams, mixed",
                     "plain_tps": done["plain"][0] / max(done["plain"][1], 1e-9),
                     "spec_tps": done["spec"][0] / max(done["spec"][1], 1e-9),
                     "plain_seconds": done["plain"][1], "spec_seconds": done["spec"][1],
                     "acceptance": accepted / proposed if proposed else 0.0,
                     "mean_accepted": accepted / verifications if verifications else 0.0,
                     "tokens": n_tokens})
    return rows


def _prompts(llm: Any, name: str, n: int, round_: int) -> list[Any]:
    if n == 1:  # a repeat finds its prompt in the prefix cache: decode tok/s leaves it out
        return [llm.request(WORKLOADS[name])]
    # every round's prompts start differently, so no round reuses another's prefill
    names = list(WORKLOADS)
    return [llm.request(f"Round {round_ + 1}, request {i + 1}. " + WORKLOADS[names[i % len(names)]])
            for i in range(n)]
