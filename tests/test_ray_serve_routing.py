"""The cluster's replica choice (localinfer/cluster/routing.py) and sizing, without Ray."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from localinfer.cluster.routing import (
    DEFAULT_THRESHOLD,
    PrefixMemory,
    choose_prefix_aware,
    choose_round_robin,
    rendezvous,
)
from localinfer.engine.block_manager import BlockManager, prefix_hashes
from localinfer.engine.sequence import Sequence
from localinfer.sampling_params import SamplingParams

SYSTEM = list(range(100, 148))  # three full blocks of 16


def test_prefix_keys_are_the_block_managers_cache_keys() -> None:
    ids = SYSTEM + [7, 8, 9]
    bm = BlockManager(num_blocks=16, block_size=16)
    seq = Sequence(0, "r0", ids, SamplingParams())
    bm._hash_full_blocks(seq, len(ids) // 16)
    assert prefix_hashes(ids, 16, 256) == seq.block_hashes
    assert len(seq.block_hashes) == 3
    assert prefix_hashes(ids, 16, 2) == seq.block_hashes[:2]


def test_prefix_keys_chain_so_equal_keys_mean_equal_prefixes() -> None:
    a = prefix_hashes(SYSTEM + list(range(16)), 16, 256)
    b = prefix_hashes(SYSTEM + list(range(1, 17)), 16, 256)
    assert a[:3] == b[:3] and a[3] != b[3]
    c = prefix_hashes([1] + SYSTEM[1:], 16, 256)  # differs in the first token only
    assert not set(c) & set(a)
    assert prefix_hashes(list(range(15)), 16, 256) == []


def test_rendezvous_spreads_keys_and_moves_only_the_departed_replicas() -> None:
    keys = range(2000)
    three = {k: rendezvous(k, ["a", "b", "c"]) for k in keys}
    counts = Counter(three.values())
    assert min(counts.values()) > 550, counts
    two = {k: rendezvous(k, ["a", "b"]) for k in keys}
    for k in keys:
        if three[k] != "c":
            assert two[k] == three[k]  # only c's keys moved when c went away
    four = {k: rendezvous(k, ["a", "b", "c", "d"]) for k in keys}
    assert all(four[k] in (three[k], "d") for k in keys)  # a newcomer only takes keys


def test_shared_prefix_goes_to_the_replica_that_served_it_last() -> None:
    prefix = prefix_hashes(SYSTEM, 16, 256)
    memory = PrefixMemory()
    memory.served(prefix[:2], "b")
    longer = prefix_hashes(SYSTEM + list(range(32)), 16, 256)
    rng = random.Random(0)
    for _ in range(20):
        assert choose_prefix_aware(longer, ["a", "b", "c"], {}, memory.last, rng=rng)[0] == "b"


def test_without_history_the_rendezvous_replica_of_the_first_block_is_preferred() -> None:
    rng = random.Random(1)
    for seed in range(50):
        ids = [seed] * 16 + list(range(40))
        prefix = prefix_hashes(ids, 16, 256)
        first = choose_prefix_aware(prefix, ["a", "b"], {}, {}, rng=rng)[0]
        assert first == rendezvous(prefix[0], ["a", "b"])
        # another chat with the same first block meets it there
        other = prefix_hashes(ids[:16] + list(range(90, 130)), 16, 256)
        assert choose_prefix_aware(other, ["a", "b"], {}, {}, rng=rng)[0] == first


def test_load_wins_when_the_preferred_queue_is_more_than_the_threshold_longer() -> None:
    prefix = prefix_hashes(SYSTEM, 16, 256)
    last = {prefix[-1]: "a"}
    rng = random.Random(2)
    at_threshold = {"a": DEFAULT_THRESHOLD, "b": 0}
    assert choose_prefix_aware(prefix, ["a", "b"], at_threshold, last, rng=rng)[0] == "a"
    over = {"a": DEFAULT_THRESHOLD + 1, "b": 0}
    assert choose_prefix_aware(prefix, ["a", "b"], over, last, rng=rng) == ["b", "a"]
    assert choose_prefix_aware(prefix, ["a", "b"], over, last, threshold=10, rng=rng)[0] == "a"


def test_a_departed_replica_in_history_falls_back_to_the_live_ones() -> None:
    prefix = prefix_hashes(SYSTEM, 16, 256)
    memory = PrefixMemory()
    memory.served(prefix, "gone")
    got = choose_prefix_aware(prefix, ["a", "b"], {}, memory.last, rng=random.Random(3))
    assert got[0] == rendezvous(prefix[0], ["a", "b"]) and sorted(got) == ["a", "b"]
    memory.forget("gone")
    assert memory.last == {}


def test_no_full_block_takes_the_lighter_of_two() -> None:
    rng = random.Random(4)
    picks = Counter(choose_prefix_aware([], ["a", "b", "c"], {"a": 5, "b": 0, "c": 5},
                                        {}, rng=rng)[0] for _ in range(200))
    assert picks["b"] > 120 and set(picks) <= {"a", "b", "c"}
    assert choose_prefix_aware([], [], {}, {}) == []


def test_every_candidate_is_ranked_once() -> None:
    prefix = prefix_hashes(SYSTEM, 16, 256)
    got = choose_prefix_aware(prefix, ["a", "b", "c", "d"], {"c": 3}, {}, rng=random.Random(5))
    assert sorted(got) == ["a", "b", "c", "d"]


def test_round_robin_cycles_in_a_stable_order() -> None:
    firsts = [choose_round_robin(i, ["b", "a", "c"])[0] for i in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert sorted(choose_round_robin(7, ["b", "a"])) == ["a", "b"]
    assert choose_round_robin(0, []) == []


def test_prefix_memory_is_bounded_least_recent_first() -> None:
    memory = PrefixMemory(capacity=3)
    memory.served([1, 2], "a")
    memory.served([3, 4], "b")
    assert list(memory.last) == [2, 3, 4]
    memory.served([2], "c")
    assert memory.last == {3: "b", 4: "b", 2: "c"}


@pytest.mark.parametrize(("flags", "expected"), [
    ({"replicas": 3}, {"num_replicas": 3}),
    ({"replicas": None, "min_replicas": 1, "max_replicas": 4},
     {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
      "target_ongoing_requests": 8}),
    ({"replicas": None, "min_replicas": 0, "max_replicas": 2},
     {"min_replicas": 0, "max_replicas": 2, "initial_replicas": 1,
      "target_ongoing_requests": 8}),
])
def test_scaling_flags(flags: dict, expected: dict) -> None:
    pytest.importorskip("starlette")
    from localinfer.cluster.launch import ClusterOptions, scaling
    from localinfer.server.config import ServerConfig

    got = scaling(ServerConfig(max_num_seqs=8), ClusterOptions(**flags))
    if "num_replicas" in expected:
        assert got == expected
    else:
        assert {k: got["autoscaling_config"][k] for k in expected} == expected
