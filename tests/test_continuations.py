"""Exact multi-turn reuse (engine/continuations.py): a chat's next turn keeps the ids the model
generated, so the prefix cache finds every earlier turn even where re-tokenizing the reply's
text would give other ids — through LLM, the chat session and the server's openai client."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.engine.continuations import Continuations
from localinfer.llm import LLM
from localinfer.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

USER1 = "Tell me about the sea."


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    with LLM(str(smollm2_path), threads=2, max_model_len=1024) as model:
        yield model


def _split_ids(llm: LLM, word: str) -> list[int]:
    """Ids that spell `word` in two pieces, where encoding the word gives another tokenization."""
    tok = llm.tokenizer
    whole = tok.encode(word, add_special=False)
    for cut in range(1, len(word)):
        pieces = (tok.encode(word[:cut], add_special=False)
                  + tok.encode(word[cut:], add_special=False))
        if pieces != whole and tok.decode(pieces) == word:
            return pieces
    raise AssertionError(f"no second tokenization of {word!r}")


def test_a_reply_that_retokenizes_differently_keeps_its_ids_and_hits_the_cache(
        llm: LLM) -> None:
    turn1 = [{"role": "user", "content": USER1}]
    prompt_ids = llm.encode(turn1)
    reply = (" The sea is wonderful, wide and deep; it covers most of the planet and holds"
             " more life than any forest on land.")
    generated = _split_ids(llm, reply) + [llm.tokenizer.eos_id]
    # the model "said" it: the ids run through the engine (their blocks enter the prefix
    # cache) and are remembered when the request finishes
    greedy1 = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate(prompt_ids + generated, greedy1)
    turn2 = [*turn1, {"role": "assistant", "content": reply},
             {"role": "user", "content": "And the sky?"}]
    spliced = llm.encode(turn2)
    history = prompt_ids + generated
    assert spliced[: len(history)] == history
    block = llm.engine_config.block_size
    hit = llm.generate(turn2, greedy1)[0].num_cached_tokens
    assert hit >= len(history) - block
    # re-tokenizing the text instead: the same text, other ids, and the cache stops early
    saved, llm.engine.continuations = llm.engine.continuations, Continuations(llm.tokenizer)
    try:
        whole = llm.encode(turn2)
        miss = llm.generate(turn2, greedy1)[0].num_cached_tokens
    finally:
        llm.engine.continuations = saved
    assert whole != spliced
    assert llm.tokenizer.decode(whole) == llm.tokenizer.decode(spliced)
    assert miss < hit


def test_a_cut_reply_or_a_changed_history_is_not_spliced(llm: LLM) -> None:
    c = Continuations(llm.tokenizer)
    turn1 = [{"role": "user", "content": "Name three rivers, please."}]
    ids = llm.encode(turn1) + llm.tokenizer.encode(" The Nile and", add_special=False)
    c.remember(ids)  # ended mid-text (max_tokens): fine only before a special token
    rendered = llm.chat_template.render(turn1, add_generation_prompt=True)
    assert c.splice(rendered + " The Nile and the Amazon") is None  # a mid-word boundary
    follow = llm.chat_template.render(
        [*turn1, {"role": "assistant", "content": "The Nile and"},
         {"role": "user", "content": "More?"}], add_generation_prompt=True)
    if follow.startswith(rendered + " The Nile and"):  # the template keeps the leading space
        assert c.splice(follow)[: len(ids)] == ids
    edited = follow.replace("Nile", "Rhine")
    assert c.splice(edited) is None


def _turns(llm: LLM, n_turns: int) -> list[tuple[int, int, int]]:
    """(prompt tokens, cached tokens, reply tokens) of each turn of a chat."""
    messages: list[dict[str, str]] = []
    out = []
    questions = [USER1, "What lives in it?", "Is it deep?", "Thank you."]
    for i, q in enumerate(questions[:n_turns]):
        # sampled, as chats are: sampling picks non-canonical tokenizations far more often
        # than greedy decoding does, and those are what re-tokenizing the reply loses
        params = SamplingParams(max_tokens=64, temperature=1.0, seed=7 + i)
        messages.append({"role": "user", "content": q})
        result = llm.generate(messages, params)[0]
        out.append((result.num_prompt_tokens, result.num_cached_tokens,
                    len(result.token_ids)))
        messages.append({"role": "assistant", "content": result.text})
    return out


def test_every_later_turn_finds_all_earlier_turns_cached(llm: LLM) -> None:
    """The target: cached tokens on a later turn ≥ all earlier turns' tokens minus a block
    (SmolLM2's replies here re-tokenize as generated; this guards the decode-filled blocks
    reaching the prefix cache, and the splice not breaking it)."""
    turns = _turns(llm, 4)
    block = llm.engine_config.block_size
    for (prev_prompt, _, prev_reply), (prompt, cached, _) in zip(turns, turns[1:],
                                                                  strict=False):
        assert prompt > prev_prompt + prev_reply
        # everything before this turn's new message: the earlier prompt and its reply
        assert cached >= prev_prompt + prev_reply - block, turns


def test_server_clients_that_resend_text_hit_the_cache(server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Write a short poem about the moon."}]
    r1 = client.chat.completions.create(model="smollm2-test", messages=messages,
                                        max_tokens=60, temperature=1.0, seed=3)
    messages += [{"role": "assistant", "content": r1.choices[0].message.content},
                 {"role": "user", "content": "Now one about the sun."}]
    r2 = client.chat.completions.create(model="smollm2-test", messages=messages,
                                        max_tokens=8, temperature=0)
    earlier = r1.usage.prompt_tokens + r1.usage.completion_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= earlier - 16
