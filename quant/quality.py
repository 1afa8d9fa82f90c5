"""Quality report: how far model B (e.g. a quantization) drifts from model A (its source) on a
text, computed with our engine.

The text is tokenized once with A's tokenizer (both models must share the vocabulary) and cut
into windows of `ctx` tokens (a BOS first when the vocabulary adds one). Every position of a
window after the first predicts the next token; over all of them we report

    perplexity of A and of B      exp(mean negative log-likelihood of the actual next token)
    KL(A‖B)                       sum_v p_A(v) (log p_A(v) - log p_B(v)), mean / p99 / max
    top-1 agreement               how often both models rank the same token first

A's log-probabilities go to a temporary file between the two passes (as llama.cpp's
--kl-divergence-base does), so only one model is in memory at a time.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localinfer.errors import InvalidRequestError, UnsupportedModelError

DEFAULT_CTX = 512


@dataclass(slots=True)
class QualityReport:
    n_tokens: int  # scored positions
    n_windows: int
    ctx: int
    backend: str
    ppl_a: float
    ppl_b: float
    kl_mean: float
    kl_stderr: float
    kl_p99: float
    kl_max: float
    top1: float  # fraction of positions where argmax A == argmax B

    def format(self, name_a: str = "A", name_b: str = "B") -> str:
        width = max(len(name_a), len(name_b))
        return "\n".join([
            f"quality of {name_b} against {name_a}: {self.n_tokens} tokens in "
            f"{self.n_windows} windows of {self.ctx} ({self.backend} backend)",
            f"  perplexity   {name_a:<{width}} {self.ppl_a:9.4f}",
            f"  perplexity   {name_b:<{width}} {self.ppl_b:9.4f}   "
            f"({100 * (self.ppl_b / self.ppl_a - 1):+.2f}%)",
            f"  KL(A‖B)      mean {self.kl_mean:.6f} ± {self.kl_stderr:.6f}, "
            f"p99 {self.kl_p99:.6f}, max {self.kl_max:.6f}",
            f"  top-1 agreement {100 * self.top1:.2f}%",
        ])


def read_text(path: str | os.PathLike[str] | None) -> str:
    """The text of a file (UTF-8), or the built-in sample when path is None."""
    if path is None:
        from .sample_text import SAMPLE_TEXT

        return SAMPLE_TEXT
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidRequestError(f"text file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{path}: not UTF-8 text ({exc.reason})") from None


def windows(tokens: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """Consecutive windows of at most ctx tokens, each led by BOS when bos is not None."""
    step = ctx - (bos is not None)
    out = []
    for i in range(0, len(tokens), step):
        w = ([bos] if bos is not None else []) + tokens[i:i + step]
        if len(w) >= 2:
            out.append(w)
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits - logits.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _vocab(path: Path) -> list[str]:
    from localinfer.gguf_file import open_gguf
    from localinfer.gguf_strings import StringArray

    with open_gguf(path) as g:
        tokens = g.metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, StringArray) or not tokens:
            raise InvalidRequestError(f"{path}: no tokenizer vocabulary")
        return tokens.to_list()


def numba_can_run(path: Path) -> bool:
    """Whether the Numba backend supports this file's architecture and every tensor type."""
    from localinfer.backends.numba_cpu.quants import FORMATS, QBLOCK

    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import ModelConfig

    with open_gguf(path) as g:
        try:
            cfg = ModelConfig.from_gguf(g)
            cfg.check_tensors(g)
        except UnsupportedModelError:
            return False
        return all(t.ggml_type in FORMATS and (t.ggml_type <= 1 or t.shape[0] % QBLOCK == 0)
                   for t in g.tensors.values())


def choose_backend(paths: list[Path], backend: str = "auto") -> str:
    if backend != "auto":
        return backend
    if all(numba_can_run(p) for p in paths):
        return "numba"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise UnsupportedModelError(
            "the numba backend cannot run one of these models (architecture or tensor types) "
            "and llama-cpp-python is not installed (pip install 'localinfer[llamacpp]')"
        ) from None
    return "llamacpp"


def _open_llm(path: Path, backend: str, ctx: int, threads: int | None):  # type: ignore[no-untyped-def]
    from localinfer.llm import LLM

    # score() adds one generated token after the window
    return LLM(path, backend, threads=threads, max_model_len=ctx + 1, max_num_seqs=1,
               max_num_batched_tokens=min(ctx, 512), enable_prefix_caching=False)


def compare(model_a: str | os.PathLike[str], model_b: str | os.PathLike[str], text: str, *,
            ctx: int = DEFAULT_CTX, threads: int | None = None, backend: str = "auto",
            progress: bool | None = None,
            note: Callable[[str], None] | None = None) -> QualityReport:
    """Perplexities, KL(A‖B) and top-1 agreement of two models over `text`."""
    from localinfer.catalog import Catalog
    from localinfer.progress import ProgressBar

    note = note or (lambda msg: print(f"localinfer: {msg}", file=sys.stderr))
    if ctx < 2:
        raise InvalidRequestError("--ctx must be at least 2 tokens")
    catalog = Catalog.load()
    path_a, path_b = (catalog.resolve(m, progress=bool(progress)) for m in (model_a, model_b))
    vocab_a, vocab_b = _vocab(path_a), _vocab(path_b)
    if vocab_a != vocab_b:
        raise InvalidRequestError(
            f"{path_a.name} and {path_b.name} have different vocabularies "
            f"({len(vocab_a)} vs {len(vocab_b)} tokens): KL and agreement need the same one")
    chosen = choose_backend([path_a, path_b], backend)
    if backend == "auto" and chosen != "numba":
        note("the numba backend cannot run these models; evaluating with llama.cpp")

    llm = _open_llm(path_a, chosen, ctx, threads)
    try:
        tok = llm.tokenizer
        ids = tok.encode(text, add_special=False, parse_special=False)
        wins = windows(ids, ctx, tok.bos_id if tok.add_bos else None)
        n = sum(len(w) - 1 for w in wins)
        if n == 0:
            raise InvalidRequestError("the text is empty: it needs at least two tokens")
        n_vocab = llm.config.n_vocab
        with tempfile.TemporaryDirectory(prefix="localinfer-eval-") as tmp:
            # A's log-probabilities, (n, n_vocab) float32, on disk between the passes
            lp_a = np.lib.format.open_memmap(Path(tmp) / "a.npy", "w+", np.float32, (n, n_vocab))
            nll_a = np.empty(n)
            top_a = np.empty(n, np.int64)
            with ProgressBar(n, "evaluating A", enabled=progress, unit="tokens") as bar:
                at = 0
                for w in wins:
                    lp = log_softmax(llm.score(w)[:-1])
                    k = len(w) - 1
                    lp_a[at:at + k] = lp
                    nll_a[at:at + k] = -lp[np.arange(k), w[1:]]
                    top_a[at:at + k] = lp.argmax(axis=1)
                    at += k
                    bar.update(k)
            llm.close()
            llm = None
            llm = _open_llm(path_b, chosen, ctx, threads)
            if llm.config.n_vocab != n_vocab:
                raise InvalidRequestError("the two models have different output sizes")
            nll_b = np.empty(n)
            kl = np.empty(n)
            agree = np.empty(n, bool)
            with ProgressBar(n, "evaluating B", enabled=progress, unit="tokens") as bar:
                at = 0
                for w in wins:
                    lp = log_softmax(llm.score(w)[:-1])
                    k = len(w) - 1
                    ref = lp_a[at:at + k]
                    nll_b[at:at + k] = -lp[np.arange(k), w[1:]]
                    kl[at:at + k] = (np.exp(ref) * (ref - lp)).sum(axis=1, dtype=np.float64)
                    agree[at:at + k] = lp.argmax(axis=1) == top_a[at:at + k]
                    at += k
                    bar.update(k)
            del lp_a
    finally:
        if llm is not None:
            llm.close()
    return QualityReport(
        n_tokens=n, n_windows=len(wins), ctx=ctx, backend=chosen,
        ppl_a=math.exp(nll_a.mean()), ppl_b=math.exp(nll_b.mean()),
        kl_mean=float(kl.mean()), kl_stderr=float(kl.std() / math.sqrt(n)),
        kl_p99=float(np.percentile(kl, 99)), kl_max=float(kl.max()),
        top1=float(agree.mean()),
    )


