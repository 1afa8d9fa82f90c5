"""Decode throughput of the llama.cpp backend under localinfer's engine vs llama-cpp-python's
own loop (Llama.eval one token at a time), same file, same threads, measured in one process:

    python -m localinfer.backends.llamacpp.bench MODEL.gguf [--threads 2] [--tokens 128]

The machines here are small and noisy: compare the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from localinfer import LLM, SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def engine_decode_tps(llm: LLM, prompts: list[list[int]], n: int) -> float:
    """Aggregate decode tok/s once every sequence has its first token (prefill excluded)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    got = dict.fromkeys(ids, 0)
    while min(got.values()) == 0:
        for out in engine.step():
            got[out.seq_id] += len(out.token_ids)
    start, before = time.perf_counter(), sum(got.values())
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.seq_id] += len(out.token_ids)
    return (sum(got.values()) - before) / (time.perf_counter() - start)


def llama_cpp_python_tps(path: str, prompt: list[int], n: int, threads: int) -> float:
    """llama-cpp-python's own loop: one Llama.eval per token, greedy from its scores."""
    import llama_cpp

    ref = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    ref.eval(prompt)
    token = int(np.argmax(ref.scores[ref.n_tokens - 1]))
    start = time.perf_counter()
    for _ in range(n - 1):
        ref.eval([token])
        token = int(np.argmax(ref.scores[ref.n_tokens - 1]))
    tps = (n - 1) / (time.perf_counter() - start)
    ref.close()
    return tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with LLM(a.model, backend="llamacpp", threads=a.threads, max_model_len=2048) as llm:
        prompt = llm.encode(PROMPT)
        many = [llm.encode(f"{PROMPT} Variant {i}.") for i in range(a.concurrency)]
        for _ in range(a.repeat):  # interleaved, so both see the same machine load
            ours1 = engine_decode_tps(llm, [prompt], a.tokens)
            peer1 = llama_cpp_python_tps(a.model, prompt, a.tokens, a.threads)
            ours16 = engine_decode_tps(llm, many, a.tokens)
            print(f"single stream: localinfer+llamacpp {ours1:.1f} tok/s, llama-cpp-python loop "
                  f"{peer1:.1f} tok/s ({ours1 / peer1:.2f}x); {a.concurrency} concurrent: "
                  f"localinfer+llamacpp {ours16:.1f} tok/s aggregate "
                  f"({ours16 / peer1:.2f}x llama-cpp-python, which serves one at a time)")


if __name__ == "__main__":
    main()
