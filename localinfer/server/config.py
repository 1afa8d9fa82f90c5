"""ServerConfig: everything `localinfer serve` is told, in one place."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
DEFAULT_MAX_BODY_BYTES = 8 << 20


@dataclass(slots=True)
class ServerConfig:
    model: str | None = None  # catalog name or .gguf path; None: the catalog default
    # several models (serve --model, repeatable): `model` is then the first, the default
    models: list[str] = field(default_factory=list)
    allow_pull: bool = False  # pull a catalog model a request names if it is not pulled
    max_memory: int | None = None  # bytes the models may hold (None: models/memory_plan's default)
    keep_alive: Any = None  # idle models unload after this (models/keep_alive.py); None: default
    served_model_name: str | None = None  # the id clients send as `model`
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allowed_hosts: list[str] = field(default_factory=list)  # extra Host header names; "*": any
    cors_origins: list[str] = field(default_factory=list)  # empty: CORS off
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue: int | None = None  # waiting requests before 429
    # prompt tokens waiting for their prefill beyond which a new request gets 429 (None: any)
    max_prefill_backlog: int | None = None
    drain_timeout: float = 30.0  # SIGTERM: how long in-flight requests may finish
    backend: str = "numba"
    backend_options: dict[str, Any] | None = None  # runner keywords, e.g. n_gpu_layers
    threads: int | None = None
    max_model_len: int | None = None
    kv_cache_mb: float | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    # LLM's speculative= / num_speculative_tokens= (commands/speculative_flags.py)
    speculative: dict[str, Any] = field(default_factory=dict)
    warmup: bool = True  # compile/run the kernels once before reporting ready
    log_level: str = "info"


def model_args(config: ServerConfig) -> list[str]:
    """The models --model named, in order (empty: every pulled catalog model)."""
    if config.models:
        return list(config.models)
    return [config.model] if config.model else []


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
