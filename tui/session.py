"""ChatSession: a loaded model plus the engine loop that runs it off the UI thread.

Each turn resends the whole conversation; the engine's prefix cache finds the blocks of the
earlier turns, so only the new tokens are prefilled. No Textual here (the plain REPL uses it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.tui.conversation import Conversation

if TYPE_CHECKING:
    from localinfer.engine.engine_loop import RequestHandle
    from localinfer.engine.outputs import EngineStats
    from localinfer.llm import LLM
    from localinfer.progress import ProgressCallback
    from localinfer.sampling_params import SamplingParams

NEAR_FULL = 0.8  # warn when this share of the context is used


@dataclass(slots=True)
class LoadOptions:
    model: str | None = None
    backend: str = "numba"
    backend_options: dict[str, Any] | None = None  # runner keywords, e.g. n_gpu_layers
    threads: int | None = None
    ctx: int | None = None
    kv_cache_mb: float | None = None
    warmup: bool = True
    progress: bool = False  # pull and compile displays on stderr (the plain REPL)
    # LLM's speculative= / num_speculative_tokens= (commands/speculative_flags.py)
    speculative: dict[str, Any] = field(default_factory=dict)


class ChatSession:
    def __init__(self, llm: LLM, model_name: str) -> None:
        from localinfer.engine.engine_loop import EngineLoop
        from localinfer.sampling_defaults import SamplingDefaults

        self.llm = llm
        self.model_name = model_name
        self.sampling_defaults = SamplingDefaults.from_metadata(llm.gguf.metadata)
        self.loop = EngineLoop(llm.engine).start()

    @classmethod
    def load(
        cls, options: LoadOptions, on_progress: ProgressCallback | None = None
    ) -> ChatSession:
        """Resolve (pulling if needed) and load a model; blocking — call it off the UI thread."""
        from localinfer.catalog import Catalog
        from localinfer.llm import LLM
        from localinfer.sampling_params import SamplingParams

        catalog = Catalog.load()
        path = catalog.resolve(options.model, progress=options.progress,
                               on_progress=on_progress)
        llm = LLM(path, backend=options.backend, threads=options.threads,
                  max_model_len=options.ctx, kv_cache_mb=options.kv_cache_mb,
                  progress=options.progress, backend_options=options.backend_options,
                  **options.speculative)
        if options.warmup:  # compile (or load compiled) kernels before the first turn
            llm.generate("Hi", SamplingParams(max_tokens=2, temperature=0.0))
        name = options.model or catalog.default
        if os.sep in name or name.endswith(".gguf"):
            name = Path(name).stem
        return cls(llm, name)

    @property
    def context_limit(self) -> int:
        return self.llm.engine.max_model_len

    def encode(self, conv: Conversation) -> list[int]:
        return self.llm.encode(conv.prompt_messages())

    def submit(self, ids: list[int], params: SamplingParams, *, aio: bool,
               paced: bool = False) -> RequestHandle:
        return self.loop.submit(ids, params, aio=aio, paced=paced)

    def stats(self) -> EngineStats:
        return self.loop.stats()

    def reply_reserve(self, max_tokens: int) -> int:
        """Room a prompt must leave for the reply before we call the context full."""
        return max(1, min(max_tokens, self.context_limit // 8))

    def fits(self, n_prompt: int, max_tokens: int) -> bool:
        return n_prompt + self.reply_reserve(max_tokens) <= self.context_limit

    def turns_to_drop(self, conv: Conversation) -> int | None:
        """How many of the oldest turns must go for the conversation to fit; 0 if it fits,
        None if even the last message alone does not fit."""
        max_tokens = conv.settings.max_tokens
        if self.fits(len(self.encode(conv)), max_tokens):
            return 0
        for n in range(1, conv.num_turns()):
            trial = Conversation(system=conv.system, messages=list(conv.messages))
            trial.drop_oldest_turns(n)
            if self.fits(len(self.encode(trial)), max_tokens):
                return n
        return None

    def close(self) -> None:
        self.loop.shutdown(drain_timeout=0.0)
        self.llm.close()
