"""Typed exceptions: every user-facing failure is one of these (the CLI prints one line)."""

from __future__ import annotations


class LocalInferError(Exception):
    """Base class for all errors localinfer reports to its users."""


class GGUFError(LocalInferError):
    """A file is not a valid GGUF file (bad magic, hostile counts, truncated data, ...)."""


class UnsupportedModelError(LocalInferError):
    """A valid GGUF file that this backend cannot run (architecture or tensor type)."""


class ModelNotFoundError(LocalInferError):
    """A model name is neither a catalog entry nor an existing file."""


class PullError(LocalInferError):
    """Fetching a model failed (network, checksum, disk)."""


class TokenizerError(LocalInferError):
    """The tokenizer metadata is missing or inconsistent."""


class ChatTemplateError(LocalInferError):
    """A chat template failed to render (unsafe, too large, or raised an exception)."""


class ContextLengthExceededError(LocalInferError):
    """A prompt does not fit into the model's context window."""

    def __init__(self, n_prompt: int, n_ctx: int, what: str = "prompt") -> None:
        super().__init__(
            f"{what} has {n_prompt} tokens but the context length is {n_ctx} tokens"
        )
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class InvalidRequestError(LocalInferError):
    """Bad sampling parameters, bad token ids, and other caller mistakes."""


class BackendUnavailableError(LocalInferError):
    """A backend was requested whose optional dependencies are not installed."""


class BundleError(LocalInferError):
    """An offline bundle is damaged, hostile or incomplete, or cannot be built."""


class EngineClosedError(LocalInferError):
    """A step was asked of an engine whose model has been freed (the server is shutting down)."""
