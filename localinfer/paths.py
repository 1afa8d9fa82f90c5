"""Where localinfer keeps its files: models, compiled kernels, repacked weights, tokenizers,
conversations.

Everything lives under platformdirs' user cache dir unless LOCALINFER_HOME points elsewhere;
saved chats live under the user data dir (LOCALINFER_DATA_DIR overrides only that).
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    env = os.environ.get("LOCALINFER_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("localinfer", appauthor=False))


def models_dir() -> Path:
    return home() / "models"


def kernel_cache_dir() -> Path:
    """Numba's on-disk cache of compiled kernels (NUMBA_CACHE_DIR)."""
    return home() / "numba"


def weight_cache_dir() -> Path:
    """Repacked model weights, beside the kernel cache (localinfer/weight_cache.py)."""
    return home() / "weights"


def tokenizer_cache_dir() -> Path:
    """Built tokenizers, beside the weight cache (localinfer/tokenizer/cache.py)."""
    return home() / "tokenizers"


def chats_dir() -> Path:
    """Saved chat conversations (JSON files).

    LOCALINFER_DATA_DIR wins; else LOCALINFER_HOME/chats when LOCALINFER_HOME is set; else
    platformdirs' user data dir.
    """
    env = os.environ.get("LOCALINFER_DATA_DIR")
    if env:
        return Path(env).expanduser() / "chats"
    if os.environ.get("LOCALINFER_HOME"):
        return home() / "chats"
    import platformdirs

    return Path(platformdirs.user_data_dir("localinfer", appauthor=False)) / "chats"
