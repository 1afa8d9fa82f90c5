"""The llama-cpp-python functions this backend uses, checked once at import.

A missing package or a version that lacks one of the functions is a BackendUnavailableError
that names what to install, never an AttributeError deep inside a decode step.
"""

from __future__ import annotations

import ctypes
import sys
from types import ModuleType

from localinfer.errors import BackendUnavailableError

REQUIRED = (
    "llama_backend_init",
    "llama_log_set",
    "llama_log_callback",
    "llama_model_default_params",
    "llama_model_load_from_file",
    "llama_model_free",
    "llama_model_get_vocab",
    "llama_vocab_n_tokens",
    "llama_context_default_params",
    "llama_init_from_model",
    "llama_free",
    "llama_n_ctx",
    "llama_max_parallel_sequences",
    "llama_batch",
    "llama_decode",
    "llama_get_logits",
    "llama_get_memory",
    "llama_memory_clear",
    "llama_memory_seq_rm",
    "llama_memory_seq_cp",
    "llama_memory_seq_pos_max",
)
CONTEXT_FIELDS = ("n_seq_max", "kv_unified", "swa_full", "n_threads", "n_threads_batch", "n_ubatch")
INSTALL_HINT = "pip install 'localinfer[llamacpp]' (llama-cpp-python >= 0.3.16)"


def load() -> ModuleType:
    """Import llama_cpp and check that it has everything the runner calls."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend 'llamacpp' needs llama-cpp-python, which is not installed: {exc} "
            f"(install it with: {INSTALL_HINT})"
        ) from exc
    version = getattr(llama_cpp, "__version__", "?")
    missing = [name for name in REQUIRED if not hasattr(llama_cpp, name)]
    params = getattr(llama_cpp, "llama_context_params", None)
    fields = {f[0] for f in getattr(params, "_fields_", [])}
    missing += [f"llama_context_params.{f}" for f in CONTEXT_FIELDS if f not in fields]
    if missing:
        raise BackendUnavailableError(
            f"backend 'llamacpp': llama-cpp-python {version} lacks {', '.join(missing)} "
            f"(upgrade it with: {INSTALL_HINT})"
        )
    return llama_cpp


_log_callback: object = None  # kept alive for as long as llama.cpp may call it


def quiet_logs(llama_cpp: ModuleType) -> None:
    """Let llama.cpp print errors only (its info logs would flood the terminal and the TUI)."""
    global _log_callback
    if _log_callback is None:
        _log_callback = llama_cpp.llama_log_callback(_forward)
    # set every time: llama_cpp.Llama installs its own callback when it is created
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


_LOG_ERROR, _LOG_CONT = 4, 5  # ggml_log_level (3 is WARN)
_last_level = 0  # a CONT line continues the previous message, at that message's level


def _forward(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _last_level
    if level != _LOG_CONT:
        _last_level = level
    if _last_level == _LOG_ERROR:
        sys.stderr.write(text.decode("utf-8", "replace"))
