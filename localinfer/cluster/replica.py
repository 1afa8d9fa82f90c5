"""EngineReplica: one engine (LLM + EngineLoop) in a Ray Serve replica.

`generate` is a streaming method (the ingress calls it through a streaming deployment
handle). It yields tagged tuples, so that nothing but plain data crosses the process line, and
one item per engine output (each item is a message between processes, the cost that counts):
- ("out", RequestOutput, replica id, ReplicaSnapshot | None): an engine output; the last one
  carries the replica's engine figures once the request is done, for the ingress's /metrics;
- ("error", kind, message, replica id) when the request fails here: kind "invalid" (the engine
  refused the request: the client's fault), "queue_full", "stopped" (shutting down) or
  "failure".
Cancelling the stream (client gone, ingress aborting) aborts the engine sequence.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.engine.engine_loop import (
    EngineFailure,
    EngineStoppedError,
    QueueFullError,
)
from localinfer.engine.outputs import EngineStats
from localinfer.errors import InvalidRequestError
from localinfer.sampling_params import SamplingParams
from localinfer.server.config import ServerConfig

log = logging.getLogger("localinfer.cluster")


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    replica: str
    stats: EngineStats
    queued: int  # submitted, not yet admitted by the engine
    in_flight: int  # requests this replica is streaming


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    replica: str
    pid: int
    node: str
    max_model_len: int
    block_size: int


class EngineReplica:
    def __init__(self, config: ServerConfig, model: str) -> None:
        from ray import serve

        from localinfer.catalog import Catalog
        from localinfer.server.models.pool import open_engine

        # each node resolves the model in its own cache (pulled there beforehand)
        path = Catalog.load().resolve(model)
        self.llm, self.loop = open_engine(config, path)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.in_flight = 0
        log.info("engine replica %s (pid %d) serves %s", self.replica, os.getpid(), path.name)

    def info(self) -> ReplicaInfo:
        import ray

        return ReplicaInfo(self.replica, os.getpid(), ray.get_runtime_context().get_node_id(),
                           int(self.llm.engine.max_model_len),
                           int(self.llm.engine_config.block_size))

    def snapshot(self, ending: int = 0) -> ReplicaSnapshot:
        """The engine's figures; `ending`: requests counted in flight that are done."""
        return ReplicaSnapshot(self.replica, self.loop.stats(), self.loop.num_queued,
                               self.in_flight - ending)

    async def generate(self, ids: list[int], params: SamplingParams, request_id: str,
                       prefix: Sequence[int] = ()) -> AsyncIterator[tuple[Any, ...]]:
        """`prefix` is the router's (ray_router.request_prefix); unused here."""
        try:
            handle = self.loop.submit(ids, params, request_id, aio=True)
        except QueueFullError as exc:
            yield ("error", "queue_full", str(exc), self.replica)
            return
        except EngineStoppedError as exc:
            yield ("error", "stopped", str(exc), self.replica)
            return
        except InvalidRequestError as exc:
            yield ("error", "invalid", str(exc), self.replica)
            return
        self.in_flight += 1
        try:
            async for out in handle:
                snap = self.snapshot(ending=1) if out.finished else None
                yield ("out", out, self.replica, snap)
        except EngineFailure as exc:
            cause = exc.__cause__
            kind = "invalid" if isinstance(cause, InvalidRequestError) else "failure"
            yield ("error", kind, str(cause or exc), self.replica)
        finally:
            handle.abort()  # a no-op once finished; frees the sequence if cancelled
            self.in_flight -= 1

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.shutdown(drain_timeout=0)
            self.llm.close()
