"""logit_bias and echo (prompt logprobs) through the real openai client against the real
server on SmolLM2; prompt logprobs are checked against LLM.score's logits."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def token_id(server, text: str) -> int:
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": text, "add_special_tokens": False})
    (tid,) = r.json()["tokens"]
    return tid


def complete(client, **kw):
    return client.completions.create(model="smollm2-test", prompt=PROMPT, temperature=0, **kw)


def test_logit_bias_bans_the_first_choice_and_forces_another(server, client) -> None:
    first = complete(client, max_tokens=1).choices[0].text
    banned = token_id(server, first)
    other = complete(client, max_tokens=1, logit_bias={str(banned): -100}).choices[0].text
    assert other != first
    forced = token_id(server, " banana")
    text = complete(client, max_tokens=3, logit_bias={str(forced): 100}).choices[0].text
    assert text == " banana" * 3
    chat = client.chat.completions.create(
        model="smollm2-test", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, logit_bias={str(forced): 100})
    assert chat.choices[0].message.content == " banana" * 2


@pytest.mark.parametrize("bias", [{"abc": 1}, {"99999999": 1}, {"-3": 1}, {"5": 100.5},
                                  {"5": "x"}, [1, 2]])
def test_bad_logit_bias_is_a_400(client, bias) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, max_tokens=1, logit_bias=bias)
    assert e.value.body["param"] == "logit_bias"


def test_echo_with_max_tokens_0_scores_the_prompt_as_llm_score_does(server, client,
                                                                  smollm2_path) -> None:
    r = complete(client, max_tokens=0, echo=True, logprobs=2)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and lp.text_offset[-1] == PROMPT.rindex(lp.tokens[-1])
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    # the server's engine, on its own thread, scores the way LLM.score does: compare with a
    # second LLM on the same file (no engine is shared across threads)
    from localinfer.llm import LLM

    with LLM(smollm2_path, max_model_len=64, threads=1) as llm:
        logits = llm.score(ids).astype(np.float64)
    expected = logits - logits.max(-1, keepdims=True)
    expected -= np.log(np.exp(expected).sum(-1, keepdims=True))
    want = [expected[i, ids[i + 1]] for i in range(len(ids) - 1)]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=2e-3)


def test_echo_then_generated_tokens(client) -> None:
    plain = complete(client, max_tokens=3, logprobs=1)
    echoed = complete(client, max_tokens=3, logprobs=1, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    lp, gen = echoed.choices[0].logprobs, plain.choices[0].logprobs
    n = len(lp.tokens) - 3
    assert lp.tokens[n:] == gen.tokens
    assert lp.token_logprobs[n:] == pytest.approx(gen.token_logprobs, abs=1e-4)
    assert lp.text_offset[n] == len(PROMPT)
    assert echoed.usage.completion_tokens == 3
    streamed = list(complete(client, max_tokens=3, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == echoed.choices[0].text
    without_logprobs = complete(client, max_tokens=3, echo=True)
    assert without_logprobs.choices[0].text == echoed.choices[0].text


def test_echo_and_suffix_are_completions_fields(server) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "echo": True}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_suffix_on_a_model_without_fim_tokens_is_a_400_naming_it(client) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, max_tokens=4, suffix="\nreturn x\n")
    assert e.value.body["param"] == "suffix"
    assert "smollm2-test" in e.value.body["message"] and "fill-in-the-middle" in (
        e.value.body["message"])
