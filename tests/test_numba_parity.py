"""The Numba runner on the real SmolLM2 model: parity with llama.cpp, and the paged-KV invariants
(chunked prefill, batching, decode, block order) that must hold bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import assert_parity

pytest.importorskip("numba")

from localinfer.engine.batch import ScheduledBatch  # noqa: E402

pytestmark = pytest.mark.slow

BLOCK = 16
TEXT = """\
The old lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps \
as his father had taught him: one hundred and twelve, never more, never less. Out at sea the \
fishing boats were turning home, their lamps swinging like lazy fireflies over the grey water.

def fibonacci(n: int) -> list[int]:
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]

Quarterly revenue rose 12.5% to $4.3 billion, while operating costs fell from 2,150 to 1,980 \
million. Analysts at the bank expect margins of 18-20% through 2026.

Photosynthesis converts light energy into chemical energy: chlorophyll absorbs red and blue \
light, water is split into oxygen, protons and electrons, and the Calvin cycle fixes carbon \
dioxide into three-carbon sugars that the plant later assembles into glucose and starch.

La vie est belle quand on prend le temps de regarder les nuages. Der schnelle braune Fuchs \
springt über den faulen Hund. ¿Dónde está la biblioteca? 東京は日本の首都です。

<|im_start|>user
Can you list three prime numbers bigger than 100?<|im_end|>
<|im_start|>assistant
Sure: 101, 103 and 107 are all prime, since none of them is divisible by 2, 3, 5 or 7.<|im_end|>
In 1969 Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin spent about twenty-one \
hours on the surface while Michael Collins orbited above in the command module Columbia.

SELECT name, COUNT(*) AS orders FROM customers JOIN sales ON sales.customer_id = customers.id \
WHERE sales.date >= '2024-01-01' GROUP BY name HAVING COUNT(*) > 3 ORDER BY orders DESC;

To bake a simple loaf, mix 500 g of flour with 350 ml of warm water, 10 g of salt and 7 g of \
dried yeast. Knead for ten minutes, let the dough rise for an hour, shape it, rise it again, \
and bake at 230 degrees Celsius for about thirty-five minutes until the crust sounds hollow.

The committee met on Tuesday to discuss the proposal. After a long debate, the members agreed \
that the bridge should be repaired before winter, that the library would extend its opening \
hours, and that a new bus line would connect the northern villages to the railway station.
"""


def make_batch(seqs: list[tuple[list[int], int, list[int]]], logits_all: bool = True):
    """seqs: (new tokens, position of the first one, block table) per sequence."""
    tokens, positions, starts, ctx, slots, rows = [], [], [0], [], [], []
    for toks, start, table in seqs:
        for k, t in enumerate(toks):
            p = start + k
            rows.append(len(tokens))
            tokens.append(t)
            positions.append(p)
            slots.append(table[p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(len(tokens))
        ctx.append(start + len(toks))
    return ScheduledBatch(seq_ids=list(range(len(seqs))), token_ids=tokens, positions=positions,
                          seq_starts=starts, context_lens=ctx,
                          block_tables=[list(s[2]) for s in seqs], slot_mapping=slots,
                          logits_indices=rows, block_size=BLOCK)


def run_chunks(runner, tokens: list[int], chunks: list[int], table: list[int]) -> np.ndarray:
    out, start = [], 0
    for size in chunks:
        out.append(runner.execute(make_batch([(tokens[start : start + size], start, table)])))
        start += size
    return np.concatenate(out)


@pytest.fixture(scope="module", params=["native", "avx2", "generic"])
def runner(request, smollm2_path):
    """Every test runs on the host's fastest kernel path and on the plain-Numba fallback."""
    from localinfer.backends.numba_cpu.isa import resolve_isa
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    isa = resolve_isa("auto") if request.param == "native" else request.param
    if request.param == "native" and isa == "generic":
        pytest.skip("this host has no native kernel path")
    if request.param == "avx2" and resolve_isa("auto") in ("avx2", "generic"):
        # the AVX2 path runs here too where the native one is AVX-512
        pytest.skip("avx2 is this host's native path (or it lacks AVX2)")
    g = open_gguf(smollm2_path)
    r = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=160, block_size=BLOCK,
                         threads=2, isa=isa)
    assert r.isa == isa
    # speculation fills 4-token groups where vpdpbusd makes them cheap (isa.Isa.token_group)
    assert r.token_group == (4 if isa == "avx512" or (isa == "avx2" and r._isa.vnni) else 1)
    yield r
    r.close()
    g.close()


@pytest.fixture(scope="module")
def text_tokens(llama_ref) -> list[int]:
    tokens = llama_ref.tokenize(TEXT.encode(), add_bos=False, special=True)
    assert len(tokens) >= 500
    return tokens[:640]


def test_teacher_forced_logits_match_llama_cpp(runner, llama_ref, text_tokens):
    n = len(text_tokens)
    ours = run_chunks(runner, text_tokens, [512, n - 512], list(range(0, 40)))
    llama_ref.reset()
    llama_ref.eval(text_tokens)
    ref = np.array(llama_ref.scores[:n], dtype=np.float32)
    assert_parity(ref, ours, max_mean_kl=5e-3)


def test_chunked_prefill_equals_one_step(runner, text_tokens):
    toks = text_tokens[:200]
    table = list(range(40, 53))
    one = run_chunks(runner, toks, [200], table)
    three = run_chunks(runner, toks, [70, 1, 129], table)
    np.testing.assert_array_equal(one, three)


def test_batched_sequences_equal_each_alone(runner, text_tokens):
    a, b = text_tokens[:150], text_tokens[300:397]
    ta, tb = list(range(60, 70)), list(range(70, 77))
    alone_a = runner.execute(make_batch([(a, 0, ta)]))
    alone_b = runner.execute(make_batch([(b, 0, tb)]))
    both = runner.execute(make_batch([(b, 0, tb), (a, 0, ta)]))
    np.testing.assert_array_equal(both[: len(b)], alone_b)
    np.testing.assert_array_equal(both[len(b) :], alone_a)
    # then one decode step of each, together and alone
    nxt_a, nxt_b = [int(alone_a[-1].argmax())], [int(alone_b[-1].argmax())]
    dec_both = runner.execute(make_batch([(nxt_a, len(a), ta), (nxt_b, len(b), tb)]))
    dec_a = runner.execute(make_batch([(nxt_a, len(a), ta)]))
    np.testing.assert_array_equal(dec_both[0], dec_a[0])


def test_decode_step_by_step_matches_prefill(runner, text_tokens):
    toks = text_tokens[:90]
    table = list(range(80, 86))
    full = run_chunks(runner, toks, [90], table)
    steps = run_chunks(runner, toks, [60] + [1] * 30, table)
    np.testing.assert_array_equal(full, steps)


def test_shuffled_block_table_gives_identical_logits(runner, text_tokens):
    toks = text_tokens[:120]
    ordered = run_chunks(runner, toks, [120], list(range(90, 98)))
    shuffled_table = [151, 99, 120, 104, 133, 101, 147, 110]
    shuffled = run_chunks(runner, toks, [50, 70], shuffled_table)
    np.testing.assert_array_equal(ordered, shuffled)


def test_only_requested_logits_are_returned(runner, text_tokens):
    toks = text_tokens[:40]
    table = list(range(100, 103))
    full = runner.execute(make_batch([(toks, 0, table)]))
    batch = make_batch([(toks, 0, table)])
    batch.logits_indices = [39, 5]
    part = runner.execute(batch)
    np.testing.assert_array_equal(part, full[[39, 5]])


def test_long_context_decode_matches_prefill(runner, text_tokens):
    """Decode steps deep into a context (one sequence: the vector paths split its keys across
    threads) give the same bits as the prefill that computes those positions together."""
    toks = text_tokens[:600]
    table = list(range(0, 40))
    full = run_chunks(runner, toks, [600], table)
    steps = run_chunks(runner, toks, [584] + [1] * 16, table)
    np.testing.assert_array_equal(full[584:], steps[584:])
