"""Importance matrix (llama.cpp's imatrix): for each weight matrix, the mean over a text of the
squared activation entering each of its columns. Quantizers weight each weight's error by it.

File format — the GGUF that recent llama-imatrix writes (tools/imatrix/imatrix.cpp):
    general.type = "imatrix", imatrix.datasets [str], imatrix.chunk_count u32,
    imatrix.chunk_size u32; per weight, in name order, "<name>.in_sum2" F32 (n_cols, 1)
    holding the sum of squares and "<name>.counts" F32 (1, 1) the number of activation rows.
llama-quantize hands llama_model_quantize in_sum2 / counts (tools/quantize/quantize.cpp).

Computation (`compute`): like llama-imatrix, the text is tokenized with BOS, cut into chunks of
`chunk` tokens (the remainder dropped; each chunk's first token replaced by BOS when the
vocabulary adds one), every chunk run from position 0, and every token of every chunk counted,
for the matrices of the blocks (blk.*; not output.weight).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.constants import GGUFValueType as V

from localinfer.errors import GGUFError, InvalidRequestError
from localinfer.gguf_file import open_gguf

from .gguf_writer import KV, GGUFStreamWriter, TensorSpec


@dataclass(slots=True)
class Imatrix:
    sums: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (n_cols,) float64
    counts: dict[str, int] = field(default_factory=dict)
    chunk_size: int = 512
    chunk_count: int = 0
    datasets: list[str] = field(default_factory=list)

    def add(self, names: list[str], x: np.ndarray) -> None:
        """Accumulate one input (n_rows, n_cols) of the matrices `names`."""
        sq = np.einsum("ij,ij->j", x, x, dtype=np.float64)
        for name in names:
            if name in self.sums:
                self.sums[name] += sq
            else:
                self.sums[name] = sq.copy()
            self.counts[name] = self.counts.get(name, 0) + x.shape[0]

    def weights(self) -> dict[str, np.ndarray]:
        """name -> float32 per-column weights (in_sum2 / counts), what quantizers use."""
        return {n: (s / self.counts[n] if self.counts[n] else np.ones_like(s)).astype(np.float32)
                for n, s in self.sums.items()}


def save(im: Imatrix, path: str | os.PathLike[str]) -> None:
    from localinfer.atomic_file import atomic_write

    kvs = [KV("general.type", V.STRING, "imatrix"),
           KV("imatrix.datasets", V.ARRAY, im.datasets, V.STRING),
           KV("imatrix.chunk_count", V.UINT32, im.chunk_count),
           KV("imatrix.chunk_size", V.UINT32, im.chunk_size)]
    names = sorted(im.sums)
    specs = []
    for n in names:
        specs += [TensorSpec(f"{n}.in_sum2", (im.sums[n].size, 1), T.F32),
                  TensorSpec(f"{n}.counts", (1, 1), T.F32)]
    with atomic_write(Path(path)) as f:
        w = GGUFStreamWriter(f, kvs, specs)
        for n in names:
            w.write_tensor(f"{n}.in_sum2", im.sums[n].astype(np.float32))
            w.write_tensor(f"{n}.counts", np.array([im.counts[n]], np.float32))
        w.finish()


def load(path: str | os.PathLike[str]) -> Imatrix:
    """Read a GGUF imatrix (ours or llama-imatrix's); dense matrices only."""
    if not Path(path).is_file():
        raise InvalidRequestError(f"imatrix file not found: {path}")
    with open_gguf(path) as g:
        if g.metadata.get("general.type") != "imatrix":
            raise GGUFError(f"{path}: not an imatrix GGUF (general.type is not 'imatrix'; "
                            "the legacy .dat format is not supported)")
        im = Imatrix(chunk_size=int(g.metadata.get("imatrix.chunk_size", 0)),
                     chunk_count=int(g.metadata.get("imatrix.chunk_count", 0)),
                     datasets=list(g.metadata.get("imatrix.datasets", [])))
        for tname in g.tensors:
            if not tname.endswith(".in_sum2"):
                continue
            name = tname[:-len(".in_sum2")]
            if f"{name}.counts" not in g.tensors:
                raise GGUFError(f"{path}: {tname} has no matching {name}.counts")
            counts = np.asarray(g.array(f"{name}.counts"), np.float64).ravel()
            if counts.size != 1:
                raise GGUFError(f"{path}: {name}: per-expert imatrix data is not supported")
            sums = np.asarray(g.array(tname), np.float64).ravel()
            if not np.isfinite(sums).all():
                raise GGUFError(f"{path}: {name}: non-finite values")
            im.sums[name] = sums
            im.counts[name] = int(counts[0])
    return im


def compute(model: str | os.PathLike[str], text: str, chunk: int = 512,
            dataset: str = "", progress: Callable[[int, int], None] | None = None) -> Imatrix:
    """The importance matrix of a model (llama family GGUF) over a text."""
    from localinfer.tokenizer import Tokenizer

    from .reference_forward import forward

    if chunk < 16:  # llama.cpp collects only matmuls of at least 16 tokens
        raise InvalidRequestError("--chunk must be at least 16 tokens")
    with open_gguf(model) as g:
        tok = Tokenizer.from_gguf(g.metadata)
        ids = tok.encode(text, add_special=True, parse_special=False)
        n_chunks = len(ids) // chunk
        if n_chunks == 0:
            raise InvalidRequestError(f"the text has {len(ids)} tokens, fewer than one chunk of "
                                      f"{chunk}; give more text or a smaller --chunk")
        tokens = np.array(ids[:n_chunks * chunk], np.int64).reshape(n_chunks, chunk)
        if tok.add_bos:
            tokens[:, 0] = tok.bos_id
        im = Imatrix(chunk_size=chunk, chunk_count=n_chunks,
                     datasets=[dataset] if dataset else [])
        done = {"n": 0}

        def hook(names: list[str], x: np.ndarray) -> None:
            im.add(names, x)
            if progress and names[0].endswith("ffn_down.weight"):
                done["n"] += 1
                progress(done["n"], int(g.metadata[f"{g.arch}.block_count"]))

        forward(g, tokens, hook)
    return im
