"""Fill-in-the-middle prompts: `suffix` on /v1/completions and llama.cpp's `POST /infill`.

A code model trained for FIM (Qwen2.5-Coder, StarCoder, CodeLlama, DeepSeek-Coder) reads
`<FIM_PRE>prefix<FIM_SUF>suffix<FIM_MID>` and writes the middle. Its special tokens come from
the GGUF's `tokenizer.ggml.fim_*_token_id` keys when the converter wrote them, else from the
token strings the families use. With `<FIM_REP>` and `<FIM_SEP>` tokens (Qwen2.5-Coder),
llama.cpp's repo-level layout puts /infill's extra files first:

    <FIM_REP>myproject\n<FIM_SEP>{filename}\n{text}...<FIM_SEP>filename\n<FIM_PRE>...

User text is tokenized with special-token parsing off: a prefix that spells "<|fim_middle|>"
stays text and cannot rearrange the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localinfer.server.protocol import invalid

# metadata key suffix -> the token strings model families use, most common first
_ROLES: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>",
            "<｜fim▁begin｜>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>",
            "<｜fim▁hole｜>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>",
            "<｜fim▁end｜>"),
    "rep": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
}


@dataclass(frozen=True, slots=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None  # repo-level layout, when the model has both
    sep: int | None = None


def fim_tokens(llm: Any) -> FimTokens | None:
    """The model's FIM tokens, or None when it has no prefix/suffix/middle triple."""
    metadata = llm.gguf.metadata
    vocab = llm.tokenizer.vocab.token_to_id
    n_vocab = llm.tokenizer.n_vocab
    found: dict[str, int | None] = {}
    for role, names in _ROLES.items():
        token = metadata.get(f"tokenizer.ggml.fim_{role}_token_id")
        if not (isinstance(token, int) and 0 <= token < n_vocab):
            token = next((vocab[n] for n in names if n in vocab), None)
        found[role] = token
    pre, suf, mid = found["pre"], found["suf"], found["mid"]
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, found["rep"], found["sep"])


def require_fim(llm: Any, model: str, param: str) -> FimTokens:
    tokens = fim_tokens(llm)
    if tokens is None:
        raise invalid(param, f"the model '{model}' has no fill-in-the-middle tokens (its GGUF "
                      "has no tokenizer.ggml.fim_pre/suf/mid_token_id and no <|fim_prefix|>-"
                      "style tokens): use a code model trained for FIM, e.g. qwen2.5-coder")
    return tokens


def fim_prompt(llm: Any, fim: FimTokens, prefix: str, suffix: str, *, middle: str = "",
               extra: list[tuple[str, str]] | None = None) -> list[int]:
    """Token ids of a FIM prompt; `extra`: (filename, text) context files (/infill's
    input_extra), `middle`: text already written after the cursor (/infill's prompt)."""
    tok = llm.tokenizer

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False) if s else []

    ids: list[int] = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    if fim.rep is not None and fim.sep is not None:
        ids += [fim.rep] + text("myproject\n")
        for filename, body in extra or []:
            ids += [fim.sep] + text(f"{filename}\n{body}")
        ids += [fim.sep] + text("filename\n")
    else:
        for _, body in extra or []:
            ids += text(body)
    ids += [fim.pre] + text(prefix) + [fim.suf] + text(suffix) + [fim.mid] + text(middle)
    return ids


def parse_extra(value: Any) -> list[tuple[str, str]]:
    """/infill's input_extra: [{"filename": str, "text": str}, ...]."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("input_extra", "'input_extra' must be an array of {filename, text}")
    chunks = []
    for i, chunk in enumerate(value):
        if not (isinstance(chunk, dict) and isinstance(chunk.get("text", ""), str)
                and isinstance(chunk.get("filename", ""), str)):
            raise invalid("input_extra", f"input_extra[{i}] must be an object with string "
                          "'filename' and 'text'")
        chunks.append((chunk.get("filename", ""), chunk.get("text", "")))
    return chunks
