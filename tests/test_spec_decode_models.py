"""Speculative decoding on real kernels: `localinfer run --speculative ngram` on a tiny
generated model, and Qwen2.5-Coder-0.5B editing code given in its prompt — the same greedy
tokens with and without speculation, with guesses accepted."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from gguf_factory import write_tiny_llama
from test_cli import cli

from localinfer.sampling_params import SamplingParams

CODE_EDIT = '''Rename the variable `count` to `n_valid` in this function. Output only the function.

```python
def mean_of_valid(values, low=0, high=100):
    total = 0
    count = 0
    for value in values:
        if value is None:
            continue
        if value < low or value > high:
            continue
        total += value
        count += 1
    if count == 0:
        return None
    return total / count
```'''


def test_run_speculative_flag_gives_plain_output_and_stats(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    # a prompt that repeats itself: the tiny model's text often continues the repetition
    prompt = "abc abd abc abd abc abd abc abd abc"
    args = ("run", "--model", str(model), "--max-tokens", "24", "-t", "0", "--raw",
            "--stats", prompt)
    plain = cli(*args)
    spec = cli(*args, "--speculative", "ngram", "--num-speculative-tokens", "3")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    found = re.search(r"speculative: (\d+)/(\d+) guessed tokens accepted .* over (\d+) "
                      r"verifications", spec.stderr)
    assert found, spec.stderr
    accepted, proposed, verifications = map(int, found.groups())
    assert 0 < accepted <= proposed and verifications > 0
    assert "speculative:" not in plain.stderr


@pytest.mark.slow
def test_qwen_code_edit_same_tokens_with_ngram_speculation(qwen2_path: Path) -> None:
    from localinfer.llm import LLM

    params = SamplingParams(max_tokens=96, temperature=0.0)
    outputs = {}
    for spec in (None, "ngram"):
        with LLM(str(qwen2_path), max_model_len=1024, speculative=spec) as llm:
            outputs[spec] = llm.generate(llm.request(CODE_EDIT), params)[0].token_ids
            stats = llm.engine.stats()
    assert outputs["ngram"] == outputs[None] and len(outputs[None]) > 40
    # the reply repeats the function: most guesses hold
    assert stats.spec_verifications > 0 and stats.spec_accepted_tokens > 30
    assert stats.spec_acceptance_rate > 0.5


@pytest.mark.slow
def test_llamacpp_rolls_back_rejected_guesses(smollm2_path: Path) -> None:
    """The llama.cpp backend keeps K/V of its own: rejected guesses must leave it
    (llama_memory_seq_rm), or later tokens attend to them and the text changes. (Free text
    is not compared: llama.cpp's multi-token steps round differently from its one-token
    ones, so near-ties may flip, as in test_llamacpp_backend.)"""
    pytest.importorskip("llama_cpp")
    from localinfer.llm import LLM

    params = SamplingParams(max_tokens=64, temperature=0.0)
    outputs = {}
    for spec in (None, "ngram"):
        with LLM(str(smollm2_path), backend="llamacpp", threads=2, max_model_len=1024,
                 speculative=spec, backend_options={"flash_attn": False}) as llm:
            outputs[spec] = llm.generate(llm.request(CODE_EDIT), params)[0].token_ids
            stats = llm.engine.stats()
            kv = llm.engine.runner.kv
            assert not kv.live  # finished: llama.cpp holds only cached blocks' cells
            for seq, blocks in kv.cell_blocks().items():
                top = max(kv.records[b].index + 1 for b in blocks) * 16 - 1
                assert llm.engine.runner.seq_pos_max(seq) == top
    assert outputs["ngram"] == outputs[None]
    assert stats.spec_accepted_tokens > 10
    assert stats.spec_accepted_tokens < stats.spec_proposed_tokens  # some rolled back


@pytest.mark.slow
def test_smollm2_eight_batched_with_speculation_equal_plain_alone(smollm2_path: Path) -> None:
    """8 prompts at once — prefill chunks beside speculating decodes (the batch-size rule
    raised to 8 so they all guess) — give each prompt's plain greedy tokens."""
    from localinfer.llm import LLM

    prompts = [CODE_EDIT, "List the days of the week, then list them again.",
               "Count from 1 to 20 separated by commas.", "Tell me a story about a cat.",
               "Repeat this sentence three times: the quick brown fox jumps over the dog.",
               "What is the capital of France?", "Write the alphabet in capitals.",
               "Write a Python function that reverses a list."]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    with LLM(str(smollm2_path), max_model_len=1024, max_num_batched_tokens=64) as llm:
        plain = [llm.generate(llm.request(p), params)[0].token_ids for p in prompts]
    with LLM(str(smollm2_path), max_model_len=1024, max_num_batched_tokens=64,
             speculative="ngram") as llm:
        llm.engine.speculator.max_decodes = 8
        batched = [r.token_ids for r in llm.generate([llm.request(p) for p in prompts], params)]
        stats = llm.engine.stats()
    assert batched == plain
    assert stats.spec_accepted_tokens > 20


@pytest.mark.slow
def test_bench_speculative_table(smollm2_path: Path, tmp_path: Path) -> None:
    import json

    out = tmp_path / "spec.json"
    start = time.perf_counter()
    proc = cli("bench", "--speculative", "ngram", "--quick", "--tokens", "24", "--model",
               str(smollm2_path), "--threads", "2", "--json", str(out))
    proc_seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    for row in ("code edit", "passage answer", "story", "code generation",
                "4 streams, mixed", "speed-up"):
        assert row in proc.stdout
    doc = json.loads(out.read_text())
    assert [r["workload"] for r in doc["rows"]] == ["code edit", "passage answer", "story",
                                                   "code generation", "4 streams, mixed"]
    assert all(r["plain_tps"] > 0 and r["spec_tps"] > 0 for r in doc["rows"])
    # each side's tok/s is on its own clock: the sum of its own steps in the lockstep
    assert all(0 < r["plain_seconds"] < proc_seconds and 0 < r["spec_seconds"] < proc_seconds
               for r in doc["rows"])
    assert doc["rows"][0]["acceptance"] > 0  # the code edit repeats its prompt


def test_lockstep_alternates_which_side_steps_first() -> None:
    from localinfer.bench.speculative import _lockstep

    order: list[str] = []

    class Side:
        def __init__(self, name: str, steps: int) -> None:
            self.name, self.steps = name, steps

        @property
        def busy(self) -> bool:
            return self.steps > 0

        def step(self) -> None:
            order.append(self.name)
            self.steps -= 1

    _lockstep(Side("plain", 3), Side("spec", 2))  # type: ignore[arg-type]
    assert order == ["plain", "spec", "spec", "plain", "plain"]


def test_run_with_a_draft_model_gives_plain_output(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=1)
    draft = write_tiny_llama(tmp_path / "draft.gguf", n_layers=1, seed=2)
    args = ("run", "--model", str(model), "--max-tokens", "24", "-t", "0", "--raw",
            "--stats", "hello world and the world")
    plain = cli(*args)
    spec = cli(*args, "--speculative", str(draft), "--num-speculative-tokens", "3")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout


@pytest.mark.slow
def test_qwen_as_its_own_draft_same_tokens_all_accepted(qwen2_path: Path) -> None:
    """The draft proposer on real kernels: the 0.5B drafting for itself proposes exactly
    what the target then samples, so the text is plain greedy's and nearly every guess holds
    (a multi-token step may round a near-tie differently from a one-token one)."""
    from localinfer.llm import LLM

    params = SamplingParams(max_tokens=64, temperature=0.0)
    outputs = {}
    for spec in (None, str(qwen2_path)):
        with LLM(str(qwen2_path), max_model_len=1024, speculative=spec) as llm:
            outputs[spec] = llm.generate(llm.request(CODE_EDIT), params)[0].token_ids
            stats = llm.engine.stats()
    assert outputs[str(qwen2_path)] == outputs[None]
    assert stats.spec_verifications > 0 and stats.spec_acceptance_rate > 0.9


@pytest.mark.slow
def test_draft_with_another_vocabulary_is_refused_by_name(qwen2_path: Path,
                                                          smollm2_path: Path) -> None:
    from localinfer.errors import InvalidRequestError
    from localinfer.llm import LLM

    with pytest.raises(InvalidRequestError, match="has 49152 tokens, the target 151936"):
        LLM(str(qwen2_path), max_model_len=256, speculative=str(smollm2_path))


@pytest.mark.slow
def test_constrained_requests_speculate_within_their_grammar(smollm2_path: Path) -> None:
    """Structured output composes with speculation: guesses are cut to what the grammar
    accepts and every verified row is masked by the grammar's state after the guesses before
    it, so a JSON schema's greedy tokens are those of plain constrained decoding — alone and
    beside an unconstrained request — and guesses copied from the prompt's JSON hold."""
    import json

    from localinfer.llm import LLM
    from localinfer.structured import StructuredOutput

    schema = {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["name", "qty"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}
    source = {"items": [{"name": "red apples", "qty": 3}, {"name": "green pears", "qty": 12},
                        {"name": "yellow bananas", "qty": 7}, {"name": "blue plums", "qty": 9}]}
    prompt = "Copy this JSON exactly, nothing else:\n" + json.dumps(source)
    constrained = SamplingParams(max_tokens=96, temperature=0.0,
                                 structured=StructuredOutput(json=schema))
    free = SamplingParams(max_tokens=32, temperature=0.0)
    outputs = {}
    for spec in (None, "ngram"):
        with LLM(str(smollm2_path), max_model_len=1024, speculative=spec) as llm:
            alone = llm.generate(llm.request(prompt), constrained)[0]
            accepted_alone = llm.engine.stats().spec_accepted_tokens
            from test_structured_engine import run

            pair = run(llm, [(llm.request(prompt), constrained), (llm.request(CODE_EDIT), free)])
            assert pair[0].error is None and pair[0].token_ids == alone.token_ids
            outputs[spec] = (alone.token_ids, [r.token_ids for r in pair])
            stats = llm.engine.stats()
    assert outputs["ngram"] == outputs[None]
    assert alone.finish_reason == "stop"
    assert json.loads(alone.text)["items"]  # valid under the schema, and it copied the list
    assert accepted_alone > 10 and stats.spec_accepted_tokens > accepted_alone
