"""The draft-model proposer on tiny generated models sharing one vocabulary: greedy output
identical to plain decoding (alone and batched), no draft blocks left after the requests,
rollback leaves the draft's KV as a fresh draft's, a draft equal to the target is always
accepted, and a draft with another vocabulary is refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf_factory import build_gguf, tiny_llama_parts, write_tiny_llama

import localinfer.engine.draft_proposer as draft_proposer
from localinfer.engine.sequence import Sequence
from localinfer.errors import InvalidRequestError
from localinfer.llm import LLM
from localinfer.sampling_params import SamplingParams

PROMPTS = ["hello world and the", "the world", "and hello hello the world and the world"]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target (untied output: its greedy text varies, a tied one repeats one token) and
    a draft that is the target with noise on its last layer: it agrees on some tokens only, so
    verifications both accept and reject."""
    d = tmp_path_factory.mktemp("draft")
    target = write_tiny_llama(d / "target.gguf", seed=1, n_ctx=512, tied=False)
    kvs, tensors = tiny_llama_parts(seed=1, n_ctx=512, tied=False)
    rng = np.random.default_rng(9)
    for i, t in enumerate(tensors):
        if t.name.startswith("blk.1.") and not t.name.endswith("norm.weight"):
            w = np.frombuffer(t.data, np.float32)
            noisy = w + 0.004 * rng.standard_normal(w.shape).astype(np.float32)
            tensors[i] = dataclasses.replace(t, data=noisy.astype(np.float32).tobytes())
    draft = d / "draft.gguf"
    draft.write_bytes(build_gguf(kvs, tensors))
    return target, draft


def tokens(llm: LLM, prompts: list[str]) -> list[list[int]]:
    outs = llm.generate([llm.request(p, raw=True) for p in prompts], GREEDY)
    return [list(o.token_ids) for o in outs]


@pytest.fixture(scope="module")
def plain(models) -> list[list[int]]:
    with LLM(models[0], threads=1) as llm:
        return tokens(llm, PROMPTS)


@pytest.mark.parametrize("confidence", [0.0, draft_proposer.CONFIDENCE])
def test_draft_greedy_equals_plain_alone_and_batched(models, plain, monkeypatch, confidence):
    monkeypatch.setattr(draft_proposer, "CONFIDENCE", confidence)
    with LLM(models[0], threads=1, speculative=str(models[1]), num_speculative_tokens=4) as llm:
        assert tokens(llm, PROMPTS[:1]) == plain[:1]
        assert tokens(llm, PROMPTS) == plain
        proposer = llm.engine.speculator.proposer
        assert proposer.blocks.num_used_blocks == 0 and not proposer.drafts
        spec = llm.engine.speculator
        if confidence == 0.0:  # guesses held and failed: rollbacks in the engine's path
            assert 0 < spec.accepted_tokens < spec.proposed_tokens


def test_draft_equal_to_target_is_always_accepted(models, plain, monkeypatch):
    monkeypatch.setattr(draft_proposer, "CONFIDENCE", 0.0)
    monkeypatch.setenv("LOCALINFER_DRAFT_REQUANT", "0")  # the draft is the target's own file
    with LLM(models[0], threads=1, speculative=str(models[0]), num_speculative_tokens=4) as llm:
        assert tokens(llm, PROMPTS) == plain
        spec = llm.engine.speculator
        assert spec.proposed_tokens > 0 and spec.accepted_tokens == spec.proposed_tokens


def test_rollback_leaves_the_drafts_kv_as_a_fresh_drafts(models, monkeypatch):
    monkeypatch.setattr(draft_proposer, "CONFIDENCE", 0.0)
    with LLM(models[0], threads=1, speculative=str(models[1])) as llm:
        proposer = llm.engine.speculator.proposer
        prompt = llm.encode(llm.request(PROMPTS[2], raw=True))
        seq = Sequence(0, "a", list(prompt), GREEDY)
        guesses = proposer.propose([seq], [5])[0]
        assert len(guesses) == 5
        # the target keeps two guesses and a token of its own (not the draft's third)
        other = (guesses[2] + 1) % 300
        seq.token_ids += guesses[:2] + [other]
        proposer.accepted(seq, 5, 2)
        assert proposer.drafts[0].num_computed_tokens == len(prompt) + 2
        after = proposer.propose([seq], [4])[0]
        fresh = Sequence(1, "b", list(seq.token_ids), GREEDY)
        assert proposer.propose([fresh], [4])[0] == after
        proposer.free(seq)
        proposer.free(fresh)
        assert proposer.blocks.num_used_blocks == 0


def test_a_full_draft_pool_means_no_guesses(models, monkeypatch):
    from localinfer.engine.block_manager import BlockManager

    monkeypatch.setattr(draft_proposer, "CONFIDENCE", 0.0)
    with LLM(models[0], threads=1, speculative=str(models[1])) as llm:
        proposer = llm.engine.speculator.proposer
        proposer.blocks = BlockManager(1, proposer.block_size, False)
        short = Sequence(0, "a", [5, 6, 7], GREEDY)
        long = Sequence(1, "b", list(range(10, 10 + 2 * proposer.block_size)), GREEDY)
        out = proposer.propose([long, short], [4, 4])
        assert out[0] == [] and 1 <= len(out[1]) <= 4  # the short one fits one block
        proposer.free(long)
        proposer.free(short)
        assert proposer.blocks.num_used_blocks == 0


def write_variant(path: Path, key: str, change) -> Path:
    kvs, tensors = tiny_llama_parts(seed=3)
    kvs = [(k, t, change(v), *rest) if k == key else (k, t, v, *rest) for k, t, v, *rest in kvs]
    path.write_bytes(build_gguf(kvs, tensors))
    return path


@pytest.mark.parametrize(("key", "change", "message"), [
    ("tokenizer.ggml.tokens", lambda v: [*v[:-1], "zzz"], r"other\.gguf's token \d+ is 'zzz'"),
    ("tokenizer.ggml.eos_token_id", lambda v: 0, r"other\.gguf has EOS id 0, the target 2"),
])
def test_draft_with_another_vocabulary_is_refused(models, tmp_path, key, change, message):
    other = write_variant(tmp_path / "other.gguf", key, change)
    with pytest.raises(InvalidRequestError, match=message):
        LLM(models[0], threads=1, speculative=str(other))


def test_vocabulary_size_mismatch_names_both_sizes():
    class Tok:
        def __init__(self, n: int) -> None:
            self.n_vocab, self.bos_id, self.eos_id, self.eog_ids = n, 1, 2, frozenset({2})

    class G:
        metadata: dict = {}

    with pytest.raises(InvalidRequestError, match="draft model d has 49152 tokens, the target 151936"):
        draft_proposer.check_vocab("d", G(), G(), Tok(151936), Tok(49152))


def test_draft_on_llamacpp_gives_plain_tokens(models, monkeypatch):
    """llama.cpp keeps K/V of its own: the draft's rejected guesses must leave it too."""
    pytest.importorskip("llama_cpp")
    monkeypatch.setattr(draft_proposer, "CONFIDENCE", 0.0)
    opts = {"backend": "llamacpp", "threads": 1, "backend_options": {"flash_attn": False}}
    with LLM(models[0], **opts) as llm:
        plain = tokens(llm, PROMPTS)
    from localinfer.backends.llamacpp.runner import LlamaCppModelRunner

    made: list[bool | None] = []  # the flash_attn each runner got: the draft's too
    init = LlamaCppModelRunner.__init__

    def spy(self, *args, **kwargs):
        made.append(kwargs.get("flash_attn"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(LlamaCppModelRunner, "__init__", spy)
    with LLM(models[0], speculative=str(models[1]), num_speculative_tokens=4, **opts) as llm:
        assert made == [False, False]
        assert tokens(llm, PROMPTS) == plain
        spec = llm.engine.speculator
        assert 0 < spec.accepted_tokens < spec.proposed_tokens


def test_a_draft_runs_from_its_q4_0_copy_made_once(models, plain, tmp_path, monkeypatch):
    """A draft not in Q4_0 runs from a Q4_0 copy made once in the cache (draft_file.py): the
    tokens are still the target's own, a second load reuses the copy, a Q4_0 file runs as it
    is, LOCALINFER_DRAFT_REQUANT=0 keeps the file, and removing the model (or deleting its
    file) removes the copy."""
    from localinfer import weight_cache
    from localinfer.engine.draft_file import draft_file, drafts_dir
    from localinfer.ggml_types import GGMLQuantizationType as Q
    from localinfer.gguf_file import open_gguf

    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(draft_proposer, "CONFIDENCE", 0.0)
    source = tmp_path / "draft.gguf"
    source.write_bytes(models[1].read_bytes())
    with LLM(models[0], threads=1, speculative=str(source), num_speculative_tokens=4) as llm:
        assert tokens(llm, PROMPTS) == plain
        runner = llm.engine.speculator.proposer.runner
        copy = Path(runner.gguf.path)
        assert copy.parent == drafts_dir() and llm.engine.speculator.accepted_tokens > 0
    with open_gguf(copy) as g:
        weights = [t for t in g.tensors.values() if len(t.shape) == 2]
        assert weights and all(t.ggml_type == Q.Q4_0 for t in weights)
    made = copy.stat().st_mtime_ns
    assert draft_file(source) == copy and copy.stat().st_mtime_ns == made  # reused
    assert draft_file(copy) == copy  # already Q4_0
    monkeypatch.setenv("LOCALINFER_DRAFT_REQUANT", "0")
    assert draft_file(source) == source
    weight_cache.forget(source)
    assert not copy.exists()
    # a copy whose source was deleted goes when another copy is made
    monkeypatch.setenv("LOCALINFER_DRAFT_REQUANT", "1")
    copy = draft_file(source)
    source.unlink()
    other = tmp_path / "other.gguf"
    other.write_bytes(models[0].read_bytes())
    assert draft_file(other).exists() and not copy.exists()
