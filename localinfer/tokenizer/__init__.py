"""Tokenizers read from GGUF metadata."""

from localinfer.errors import TokenizerError
from localinfer.tokenizer.base import Tokenizer
from localinfer.tokenizer.detokenizer import IncrementalDetokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "TokenizerError"]
