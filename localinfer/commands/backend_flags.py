"""The backend flags shared by run, chat, serve and bench: --backend and its options."""

from __future__ import annotations

import argparse
from typing import Any

from localinfer.errors import InvalidRequestError


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    from localinfer.backend import available_backends

    p.add_argument("--backend", default="numba", choices=available_backends(),
                   help="numba (default: localinfer's own kernels) or llamacpp "
                        "(llama.cpp's decoder under localinfer's scheduler)")
    p.add_argument("--n-gpu-layers", type=int, default=0, metavar="N",
                   help="llamacpp backend: layers to offload to a Metal/CUDA GPU (default 0)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="llamacpp backend: flash attention; auto (default) lets llama.cpp "
                        "decide, as llama-server does (on for CPU: many sequences skip each "
                        "other's KV cells); off gives outputs bit-equal to llama-cpp-python's "
                        "Llama")


def backend_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """Keyword arguments for the backend's runner (LLM(backend_options=...))."""
    if args.n_gpu_layers < 0:
        raise InvalidRequestError(f"invalid --n-gpu-layers: must be >= 0, got {args.n_gpu_layers}")
    if args.backend != "llamacpp":
        for flag, value, default in (("--n-gpu-layers", args.n_gpu_layers, 0),
                                     ("--flash-attn", args.flash_attn, "auto")):
            if value != default:
                raise InvalidRequestError(f"{flag} needs --backend llamacpp")
        return None
    flash = {"auto": None, "on": True, "off": False}[args.flash_attn]
    return {"n_gpu_layers": args.n_gpu_layers, "flash_attn": flash}
