"""Which engine replica serves a request: the pure policy, tested without Ray.

Prefix-aware policy (`choose_prefix_aware`):
- A request's prefix is the prefix-cache keys of its prompt's first full blocks
  (engine/block_manager.prefix_hashes: the same keys the replicas' caches hold).
- Preferred replica: the one that last served the longest of those prefixes (`last`, kept by
  the caller), if it is still a candidate; else the rendezvous-hashing winner for the first
  AFFINITY_BLOCKS blocks (a system prompt's start), so requests sharing it meet on one replica
  and only the prefixes of a replica that goes away move when the replica set changes.
- Load guard: two random candidates are drawn and the less loaded taken; if the preferred
  replica's queue is more than `threshold` longer than that one's, the request goes there
  instead (a hot system prompt does not pile every chat onto one replica).
- A prompt without a full block has no prefix worth keeping: the less loaded of two.
The answer is every candidate, best first, so the caller can fall through when the first is
full.

Round-robin (`choose_round_robin`), the baseline the benchmark compares against: the n-th
request goes to the (n mod len)-th candidate in a stable order.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence

AFFINITY_BLOCKS = 1  # blocks of the prompt that pick the rendezvous replica
PREFIX_BLOCKS = 256  # blocks hashed per request (4096 tokens at block size 16)
DEFAULT_THRESHOLD = 4  # requests of queue imbalance before load wins over the cache


def rendezvous(key: int, replicas: Sequence[str]) -> str:
    """Highest-random-weight hashing: the replica whose (key, replica) hash is largest."""
    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{key}:{replica}".encode(), digest_size=8).digest()

    return max(replicas, key=weight)


def choose_prefix_aware(prefix: Sequence[int], replicas: Sequence[str],
                        queue_len: Mapping[str, int], last: Mapping[int, str],
                        threshold: int = DEFAULT_THRESHOLD,
                        rng: random.Random | None = None) -> list[str]:
    """The candidates, best first (see the module's policy)."""
    if not replicas:
        return []
    rng = rng or random.Random()
    pair = rng.sample(list(replicas), min(2, len(replicas)))
    lighter = min(pair, key=lambda r: queue_len.get(r, 0))
    preferred = _preferred(prefix, replicas, last)
    if preferred is None or queue_len.get(preferred, 0) - queue_len.get(lighter, 0) > threshold:
        first = lighter
    else:
        first = preferred
    rest = sorted((r for r in replicas if r != first), key=lambda r: queue_len.get(r, 0))
    return [first, *rest]


def _preferred(prefix: Sequence[int], replicas: Sequence[str],
               last: Mapping[int, str]) -> str | None:
    if not prefix:
        return None
    alive = set(replicas)
    for key in reversed(prefix):  # the longest prefix served before
        replica = last.get(key)
        if replica in alive:
            return replica
    return rendezvous(prefix[min(AFFINITY_BLOCKS, len(prefix)) - 1], replicas)


def choose_round_robin(count: int, replicas: Sequence[str]) -> list[str]:
    """The `count`-th request's candidates: its turn's replica first, then the others."""
    if not replicas:
        return []
    ordered = sorted(replicas)
    i = count % len(ordered)
    return ordered[i:] + ordered[:i]


class PrefixMemory:
    """Which replica last served each prefix key: bounded, least recently served dropped."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.last: OrderedDict[int, str] = OrderedDict()

    def served(self, prefix: Sequence[int], replica: str) -> None:
        for key in prefix:
            self.last[key] = replica
            self.last.move_to_end(key)
        while len(self.last) > self.capacity:
            self.last.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A replica went away: its prefixes go back to rendezvous hashing."""
        for key in [k for k, r in self.last.items() if r == replica]:
            del self.last[key]
