"""Ray Serve request routers for the engine replicas: routing.py's policies, plugged into
Serve's RequestRouter (set in the engine deployment's request_router_config).

Each router lives in the process that holds the deployment handle (the ingress replica). Its
view of load is the requests it has routed and not yet seen complete, per replica; its prefix
memory is which replica it last sent each prefix key to. Serve ranks the answer: a first
choice whose queue is full (max_ongoing_requests) falls through to the next one.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from localinfer.cluster.routing import (
    DEFAULT_THRESHOLD,
    PrefixMemory,
    choose_prefix_aware,
    choose_round_robin,
)


def request_prefix(pending: PendingRequest | None) -> tuple[int, ...]:
    """The prefix keys the ingress sent with the request (EngineReplica.generate's `prefix`)."""
    if pending is None:
        return ()
    return tuple(pending.kwargs.get("prefix") or ())


class _CountingRouter(RequestRouter):
    """Counts each replica's requests routed and not yet completed. Not FIFOMixin: a replica
    chosen for a request's prefix must serve that request, not the oldest one waiting."""

    def initialize_state(self, **kwargs: Any) -> None:
        self.load: Counter[str] = Counter()
        self.routed: dict[str, str] = {}  # Serve's internal request id -> replica

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        replica = replica_id.unique_id
        self.load[replica] += 1
        self.routed[pending_request.metadata.internal_request_id] = replica

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        replica = self.routed.pop(internal_request_id, None)
        if replica is not None and self.load[replica] > 0:
            self.load[replica] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.load.pop(replica_id.unique_id, None)

    @staticmethod
    def ranked(candidates: list[RunningReplica], order: list[str]) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidates}
        return [[by_id[rid]] for rid in order]


class PrefixAwareRouter(_CountingRouter):
    """routing.choose_prefix_aware over the live replicas."""

    def initialize_state(self, threshold: int = DEFAULT_THRESHOLD, **kwargs: Any) -> None:
        super().initialize_state()
        self.threshold = threshold
        self.memory = PrefixMemory()
        self.rng = random.Random()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        ids = [r.replica_id.unique_id for r in candidate_replicas]
        order = choose_prefix_aware(request_prefix(pending_request), ids, self.load,
                                    self.memory.last, self.threshold, self.rng)
        return self.ranked(candidate_replicas, order)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        self.memory.served(request_prefix(pending_request), replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.memory.forget(replica_id.unique_id)


class RoundRobinRouter(_CountingRouter):
    """routing.choose_round_robin: the baseline that ignores prefixes."""

    def initialize_state(self, **kwargs: Any) -> None:
        super().initialize_state()
        self.count = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        order = choose_round_robin(self.count, [r.replica_id.unique_id
                                                for r in candidate_replicas])
        self.count += 1
        return self.ranked(candidate_replicas, order)


ROUTERS = {"prefix": "localinfer.cluster.ray_router.PrefixAwareRouter",
           "round-robin": "localinfer.cluster.ray_router.RoundRobinRouter"}
