"""Pick the tokenizer implementation a GGUF file's metadata asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from localinfer.errors import TokenizerError
from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.bpe import BpeTokenizer, parse_merges
from localinfer.tokenizer.pretokenize import pre_tokenizer_spec, supported_pre_tokenizers
from localinfer.tokenizer.spm import SpmTokenizer
from localinfer.tokenizer.vocab import KEY, Vocab

# llama.cpp's default special ids per tokenizer model, used when the metadata has none.
_BPE_DEFAULT_IDS = {"bos": 11, "eos": 11}
_SPM_DEFAULT_IDS = {"bos": 1, "eos": 2, "unk": 0}

SUPPORTED_MODELS = ("gpt2", "llama")


def _flag(md: Mapping[str, Any], key: str, default: bool) -> bool:
    value = md.get(KEY + key)
    if value is None:
        return default
    if not isinstance(value, bool | int):
        raise TokenizerError(f"{KEY}{key} must be a boolean, got {value!r}")
    return bool(value)


def _text(md: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = md.get(KEY + key, default)
    if value is None:
        raise TokenizerError(f"GGUF metadata has no {KEY}{key}")
    if not isinstance(value, str):
        raise TokenizerError(f"{KEY}{key} must be a string, got {value!r}")
    return value


def tokenizer_from_gguf(md: Mapping[str, Any]) -> Tokenizer:
    model = _text(md, "model")
    if model == "gpt2":
        return _bpe_from_gguf(md)
    if model == "llama":
        return _spm_from_gguf(md)
    raise TokenizerError(
        f"unsupported tokenizer model {model!r} (supported: {', '.join(SUPPORTED_MODELS)})"
    )


def _bpe_from_gguf(md: Mapping[str, Any]) -> BpeTokenizer:
    pre = _text(md, "pre", "")
    spec = pre_tokenizer_spec(pre)
    if spec is None:
        raise TokenizerError(
            f"unsupported pre-tokenizer {pre!r} for tokenizer model 'gpt2' "
            f"(supported: {', '.join(supported_pre_tokenizers())})"
        )
    if KEY + "merges" not in md:
        raise TokenizerError(f"GGUF metadata has no {KEY}merges (required by BPE)")
    vocab = Vocab.from_metadata(md, _BPE_DEFAULT_IDS)
    ranks = parse_merges(md[KEY + "merges"], vocab.n_vocab)
    add_bos = _flag(md, "add_bos_token", spec.add_bos)
    add_eos = _flag(md, "add_eos_token", False)
    return BpeTokenizer(vocab, ranks, spec, add_bos=add_bos, add_eos=add_eos)


def _spm_from_gguf(md: Mapping[str, Any]) -> SpmTokenizer:
    scores = md.get(KEY + "scores")
    if not isinstance(scores, np.ndarray) or scores.dtype.kind != "f":
        raise TokenizerError(f"GGUF metadata has no float array {KEY}scores (required by 'llama')")
    vocab = Vocab.from_metadata(md, _SPM_DEFAULT_IDS)
    return SpmTokenizer(
        vocab,
        scores,
        add_bos=_flag(md, "add_bos_token", True),
        add_eos=_flag(md, "add_eos_token", False),
        add_space_prefix=_flag(md, "add_space_prefix", True),
    )
