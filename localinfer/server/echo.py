"""`echo` on /v1/completions: the answer's text starts with the prompt and, with `logprobs`,
its logprobs cover the prompt tokens before the generated ones — what lm-evaluation-harness's
`local-completions` reads for loglikelihood tasks.

As OpenAI and vLLM do, the first prompt token has no logprob (null: nothing precedes it to
score it in) and no top logprobs; every other prompt token has the logprob the model gave
it after the tokens before it (engine: SamplingParams.prompt_logprobs, the same rows
LLM.score returns), with the top k at that position.
"""

from __future__ import annotations

from typing import Any

from localinfer.engine.outputs import TokenLogprob

MIN_LOGPROB = -9999.0  # JSON has no -inf


def prompt_texts(llm: Any, prompt: Any, prompts: list[list[int]]) -> list[str]:
    """The text each prompt is echoed as: a string prompt as the client wrote it, token ids
    as the tokenizer decodes them."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [llm.tokenizer.decode(ids) for ids in prompts]


class EchoedPrompt:
    """One prompt's echo: its text and, when logprobs were asked for, the completions-shaped
    logprobs of its tokens."""

    def __init__(self, text: str, token_ids: list[int], tokenizer: Any) -> None:
        self.text = text
        self.token_ids = token_ids
        self.tokenizer = tokenizer

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.token_to_bytes(token_id).decode("utf-8", "replace")

    def logprobs(self, scored: list[TokenLogprob] | None) -> dict[str, Any]:
        """`scored`: the engine's logprobs of prompt tokens 1.. (one fewer than the prompt)."""
        items = scored or []
        if len(items) != len(self.token_ids) - 1:
            raise ValueError(f"the engine scored {len(items)} prompt tokens, expected "
                             f"{len(self.token_ids) - 1}")
        tokens = [self._piece(t) for t in self.token_ids]
        offsets, offset = [], 0
        for piece in tokens:
            offsets.append(offset)
            offset += len(piece)
        token_logprobs: list[float | None] = [None]
        tops: list[dict[str, float] | None] = [None]
        for item in items:
            token_logprobs.append(max(item.logprob, MIN_LOGPROB))
            tops.append({self._piece(tid): max(lp, MIN_LOGPROB) for tid, lp in item.top})
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
                "text_offset": offsets}


def join_logprobs(prompt: dict[str, Any], generated: dict[str, Any] | None) -> dict[str, Any]:
    """The prompt's logprobs, then the generated tokens' (already offset past the prompt)."""
    if generated is None:
        return prompt
    return {key: prompt[key] + generated[key] for key in prompt}
