"""The backend flags shared by run, chat, serve and bench: --backend and its options."""

from __future__ import annotations

import argparse
from typing import Any

from localinfer.errors import InvalidRequestError


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    from localinfer.backend import available_backends

    p.add_argument("--backend", default="numba", choices=available_backends(),
                   help="numba (default: localinfer's own kernels), llamacpp "
                        "(llama.cpp's decoder under localinfer's scheduler) or triton "
                        "(Triton kernels on an NVIDIA GPU: pip install 'localinfer[cuda]')")
    p.add_argument("--n-gpu-layers", type=int, default=0, metavar="N",
                   help="llamacpp backend: layers to offload to a Metal/CUDA GPU (default 0)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="llamacpp backend: flash attention; auto (default) lets llama.cpp "
                        "decide, as llama-server does (on for CPU: many sequences skip each "
                        "other's KV cells); off gives outputs bit-equal to llama-cpp-python's "
                        "Llama")
    p.add_argument("--kv-unified", choices=("auto", "on", "off"), default="auto",
                   help="llamacpp backend: KV layout; off gives each sequence its own stream "
                        "of the pool (as llama-server's slots: less attention work, but a "
                        "sequence holds at most pool / --max-num-seqs tokens), on one pool "
                        "shared by all; auto (default) takes streams only where they "
                        "shorten no sequence")


def backend_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """Keyword arguments for the backend's runner (LLM(backend_options=...))."""
    if args.n_gpu_layers < 0:
        raise InvalidRequestError(f"invalid --n-gpu-layers: must be >= 0, got {args.n_gpu_layers}")
    if args.backend != "llamacpp":
        kv_unified = getattr(args, "kv_unified", "auto")
        for flag, value, default in (("--n-gpu-layers", args.n_gpu_layers, 0),
                                     ("--flash-attn", args.flash_attn, "auto"),
                                     ("--kv-unified", kv_unified, "auto")):
            if value != default:
                raise InvalidRequestError(f"{flag} needs --backend llamacpp")
        return None
    choice = {"auto": None, "on": True, "off": False}
    return {"n_gpu_layers": args.n_gpu_layers, "flash_attn": choice[args.flash_attn],
            "kv_unified": choice[getattr(args, "kv_unified", "auto")]}
