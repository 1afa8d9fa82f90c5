"""LLM: the Python API — load a model once, then generate, stream or score.

    from localinfer import LLM, SamplingParams
    llm = LLM("smollm2-135m")
    print(llm.generate(["Hello"], SamplingParams(max_tokens=32))[0].text)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.errors import InvalidRequestError
from localinfer.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np

    from localinfer.engine.outputs import RequestOutput

# a raw text prompt, a chat (list of messages), or token ids
Prompt = str | Sequence[dict[str, Any]] | Sequence[int]


@dataclass(slots=True)
class GenerationResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    ttft_s: float = 0.0  # request arrival -> first token
    decode_s: float = 0.0  # first token -> last token
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, out: RequestOutput, start: float) -> None:
        """Fold one streamed delta in; `start` is when the request was made (perf_counter)."""
        if out.error is not None:
            from localinfer.structured.spec import StructuredOutputError

            raise StructuredOutputError(out.error)
        now = time.perf_counter()
        if out.token_ids and not self.token_ids:
            self.ttft_s = now - start
        self.text += out.text
        self.token_ids.extend(out.token_ids)
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        if self.token_ids:
            self.decode_s = now - start - self.ttft_s
        if out.finished:
            self.finish_reason = out.finish_reason

    def summary(self) -> str:
        return (
            f"prompt {self.num_prompt_tokens} tokens ({self.num_cached_tokens} cached), "
            f"generated {len(self.token_ids)} tokens, finish {self.finish_reason}\n"
            f"TTFT {self.ttft_s * 1000:.0f} ms, prefill {self.prefill_tps:.1f} tok/s, "
            f"decode {self.decode_tps:.1f} tok/s"
        )

    @property
    def prefill_tps(self) -> float:
        return (self.num_prompt_tokens - self.num_cached_tokens) / max(self.ttft_s, 1e-9)

    @property
    def decode_tps(self) -> float:
        return max(len(self.token_ids) - 1, 0) / max(self.decode_s, 1e-9)


class LLM:
    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        backend: str = "numba",
        *,
        threads: int | None = None,
        max_model_len: int | None = None,
        kv_cache_mb: float | None = None,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        progress: bool = False,
        backend_options: dict[str, Any] | None = None,
        speculative: str | None = None,
        num_speculative_tokens: int | None = None,
    ) -> None:
        """backend_options: extra keyword arguments for the backend's runner, e.g.
        {"n_gpu_layers": 99} for llamacpp. speculative: "ngram" guesses tokens by prompt
        lookup, a model (catalog name or .gguf path: a draft with this model's vocabulary,
        run on the same backend) guesses them greedily; they are verified in the same step
        (greedy outputs are unchanged), at most num_speculative_tokens per step (default 8);
        see engine/speculator.py and engine/draft_proposer.py."""
        from localinfer.backend import get_backend
        from localinfer.catalog import Catalog
        from localinfer.chat_template import ChatTemplate
        from localinfer.engine.config import (
            DEFAULT_MAX_MODEL_LEN,
            DEFAULT_NUM_SPECULATIVE_TOKENS,
            EngineConfig,
        )
        from localinfer.engine.continuations import Continuations
        from localinfer.engine.llm_engine import LLMEngine
        from localinfer.gguf_file import open_gguf
        from localinfer.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
        from localinfer.tokenizer.cache import load_tokenizer

        if num_speculative_tokens is None:
            num_speculative_tokens = DEFAULT_NUM_SPECULATIVE_TOKENS
        elif speculative is None:
            raise InvalidRequestError("num_speculative_tokens needs speculative (e.g. 'ngram')")
        # checked before the model loads: a typo costs no download or compile
        EngineConfig(speculative=speculative, num_speculative_tokens=num_speculative_tokens)
        self.path: Path = Catalog.load().resolve(model, progress=progress)
        if speculative is not None and speculative != "ngram":  # a draft: pulled like model
            speculative = str(Catalog.load().resolve(speculative, progress=progress))
        self.gguf = open_gguf(self.path)
        try:
            runner_cls = get_backend(backend)
            any_arch = runner_cls.supports_any_architecture
            self.config = ModelConfig.from_gguf(self.gguf, strict_arch=not any_arch)
            if self.config.arch in SUPPORTED_ARCHITECTURES:
                self.config.check_tensors(self.gguf)
            self.tokenizer = load_tokenizer(self.gguf)  # the tokenizer cache, else built
            self.chat_template = ChatTemplate.from_gguf(self.gguf.metadata, self.tokenizer)
            max_len = min(max_model_len or DEFAULT_MAX_MODEL_LEN, self.config.n_ctx_train)
            self.engine_config = EngineConfig(
                max_model_len=max_len,
                block_size=block_size,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                kv_cache_mb=kv_cache_mb,
                enable_prefix_caching=enable_prefix_caching,
                speculative=speculative,
                num_speculative_tokens=num_speculative_tokens,
            )
            options = dict(backend_options or {})
            self.engine_config.draft_backend_options = dict(options)
            num_blocks = self._size_kv_pools(runner_cls, options)
            runner = runner_cls(
                self.gguf,
                self.config,
                num_blocks=num_blocks,
                block_size=block_size,
                threads=threads,
                progress=progress,
                **options,
            )
        except BaseException:
            self.gguf.close()
            raise
        self.backend = backend
        self.engine = LLMEngine(runner, self.tokenizer, self.engine_config)
        self.engine.continuations = Continuations(self.tokenizer)
        self._lock = threading.Lock()  # one caller drives the engine at a time

    def _size_kv_pools(self, runner_cls: Any, options: dict[str, Any]) -> int:
        """Main KV pool blocks; for a runner with a sliding-window pool (gemma3's local
        layers, engine/sliding_window.py) also its size, in options["num_swa_blocks"]."""
        config, per_token = self.config, runner_cls.kv_bytes_per_token(self.config)
        n_sliding = sum(config.swa_layers) if config.sliding_window > 0 else 0
        if not (n_sliding and runner_cls.sliding_window_pool):
            return self.engine_config.resolve_num_blocks(per_token)
        from localinfer.engine.sliding_window import size_kv_pools

        per_layer = per_token // config.n_layers
        num_blocks, num_swa = size_kv_pools(
            self.engine_config, config.sliding_window,
            per_layer * (config.n_layers - n_sliding), per_layer * n_sliding)
        options.setdefault("num_swa_blocks", num_swa)  # an explicit size wins
        return num_blocks

    # -- prompts -----------------------------------------------------------------------------

    def request(self, prompt: str, system: str | None = None, *, raw: bool = False) -> Prompt:
        """What `localinfer run PROMPT` sends: a one-turn chat (with `system` first), or the
        text as is when `raw` or when the model has no chat template (a base model continues
        the text as written)."""
        if raw or self.chat_template.is_fallback:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def encode(self, prompt: Prompt, **template_vars: Any) -> list[int]:
        """Token ids for a text prompt, a chat (chat template applied, with `template_vars`
        such as `tools`) or ids as given. A chat that continues a recent request keeps that
        request's prompt and generated ids (engine/continuations.py)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special=True, parse_special=False)
        if isinstance(prompt, Sequence) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)  # type: ignore[arg-type]
        text = self.chat_template.render(prompt, add_generation_prompt=True, **template_vars)
        continuations = self.engine.continuations
        spliced = continuations.splice(text) if continuations is not None else None
        if spliced is not None:  # earlier turns keep the ids the model generated
            return spliced
        ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
        bos = self.tokenizer.bos_id
        # templates often write the BOS text themselves; never feed it twice
        if len(ids) > 1 and bos is not None and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None
    ) -> list[GenerationResult]:
        """Generate for one prompt or a list of prompts, batched through the scheduler."""
        params = params or SamplingParams()
        batch = self._as_batch(prompts)
        with self._lock:
            ids = [self.engine.add_request(self.encode(p), params) for p in batch]
            results: dict[int, GenerationResult] = {
                i: GenerationResult() for i in ids
            }
            starts = {i: time.perf_counter() for i in ids}
            try:
                while self.engine.has_unfinished_requests():
                    for out in self.engine.step():
                        if out.seq_id in results:  # not a leftover of an abandoned stream
                            results[out.seq_id].add(out, starts[out.seq_id])
            except BaseException:
                for i in ids:
                    self.engine.abort_request(i)
                raise
        return [results[i] for i in ids]

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield output deltas (text, token ids, finish reason) as they are generated."""
        params = params or SamplingParams()
        with self._lock:
            seq_id = self.engine.add_request(self.encode(prompt), params)
            finished = False
            try:
                while not finished and self.engine.has_unfinished_requests():
                    for out in self.engine.step():
                        if out.seq_id == seq_id:
                            finished = out.finished
                            yield out
            finally:
                if not finished:
                    self.engine.abort_request(seq_id)

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits, float32 (len(token_ids), n_vocab): row i predicts token i+1."""
        if not token_ids:
            raise InvalidRequestError("score() needs at least one token")
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        with self._lock:
            seq_id = self.engine.add_request(list(token_ids), params, prompt_logits=True)
            logits = None
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.seq_id == seq_id and out.prompt_logits is not None:
                        logits = out.prompt_logits
        if logits is None:
            raise RuntimeError("engine returned no prompt logits")
        return logits

    # -- helpers -----------------------------------------------------------------------------

    def _as_batch(self, prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        if isinstance(prompts, Sequence) and prompts:
            first = prompts[0]
            if isinstance(first, (dict, int)):
                return [prompts]  # one chat, or one list of token ids
            return list(prompts)
        raise InvalidRequestError("prompts must be a string, a chat or a non-empty list of them")

    def close(self) -> None:
        self.engine.close()
        self.gguf.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
