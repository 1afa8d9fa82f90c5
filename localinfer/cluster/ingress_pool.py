"""The ingress's model pool: the server's ModelPool whose engines are remote.

A "loaded" model in the ingress is a PromptSide (the GGUF's tokenizer, chat template and
constraint compiler: everything the routes need to validate a request and build its prompt,
without weights or KV cache) and a RemoteLoop to the engine replicas. So the ingress runs the
single-process server's routes and validation unchanged, and holds only a tokenizer's memory.
The context length is the replicas' (their KV pool may cap it below the configured one).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from localinfer.cluster.remote_loop import RemoteLoop
from localinfer.llm import LLM
from localinfer.server.models.memory_plan import ModelNeed
from localinfer.server.models.pool import ModelPool
from localinfer.server.models.slot import SlotState

INFO_TIMEOUT_S = 600.0  # the first replica may still be loading (and compiling kernels)


class _PromptEngine:
    """The parts of LLMEngine the routes read."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        from localinfer.engine.continuations import Continuations
        from localinfer.structured.guide import GuideFactory

        self.max_model_len = max_model_len
        self.guides = GuideFactory(tokenizer)
        self.continuations = Continuations(tokenizer)


class PromptSide:
    """An LLM without weights: path, gguf, tokenizer, chat_template, engine, encode, close."""

    encode = LLM.encode  # the same prompt building (templates, continuations) as an LLM's

    def __init__(self, path: Path, max_model_len: int) -> None:
        from localinfer.chat_template import ChatTemplate
        from localinfer.gguf_file import open_gguf
        from localinfer.tokenizer.cache import load_tokenizer

        self.path = path
        self.gguf = open_gguf(path)
        try:
            self.tokenizer = load_tokenizer(self.gguf)
            self.chat_template = ChatTemplate.from_gguf(self.gguf.metadata, self.tokenizer)
        except BaseException:
            self.gguf.close()
            raise
        self.engine = _PromptEngine(self.tokenizer, max_model_len)

    def close(self) -> None:
        self.gguf.close()


class RemotePool(ModelPool):
    """ModelPool over engine replicas (`engine`: the Serve deployment handle)."""

    engine: Any = None  # set by the ingress before the pool loads anything
    snapshot_labels = ("model", "replica")

    def _estimate(self, path: Path) -> ModelNeed:
        return ModelNeed(weights_bytes=0, kv_bytes=0)  # the replicas hold the memory

    async def _open_async(self, path: Path) -> tuple[Any, Any]:
        assert self.engine is not None
        # on the event loop: Serve's handles may route on it (no router thread of their own)
        info = await asyncio.wait_for(self.engine.info.remote(), INFO_TIMEOUT_S)
        llm = await asyncio.to_thread(PromptSide, path, info.max_model_len)
        return llm, RemoteLoop(self.engine, llm.engine.continuations, info.block_size)

    def engine_snapshots(self) -> list[tuple[Any, Any, int, int]]:
        """Each replica's last reported figures, labelled (model, replica)."""
        rows: list[tuple[Any, Any, int, int]] = []
        for slot in list(self.slots.values()):
            if slot.state is SlotState.READY and isinstance(slot.loop, RemoteLoop):
                for snap in slot.loop.replica_stats.values():
                    rows.append(((slot.id, snap.replica), snap.stats, snap.queued,
                                 snap.in_flight))
        return rows
