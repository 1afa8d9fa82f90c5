"""Full-size models of a real model's shapes and weight types, with random weights, made from a
few MB of metadata: for speed runs on a machine where the real file cannot travel (a lent GPU
takes 64 MiB) — speed does not depend on the weights' values.

    python tests/gguf_shapes.py describe REAL.gguf SHAPES.gguf   # metadata + tensor table only
    python tests/gguf_shapes.py fill SHAPES.gguf OUT.gguf        # random weights of those types

`describe` keeps every metadata key (tokenizer included) and records each tensor's name, shape
and type under localinfer.shapes.*; `fill` writes a GGUF with those tensors: norms 1, quantized
blocks of random codes with small finite f16 scales (either sign), floats ~N(0, 0.02).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFValueType, GGUFWriter
from gguf import GGMLQuantizationType as QT

from localinfer.gguf_file import GGUFFile, open_gguf

SHAPES_KEY = "localinfer.shapes"
# byte offsets of the f16 scale fields (d, dmin) inside each block
F16_AT = {QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2),
          QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
          QT.IQ4_NL: (0,), QT.IQ4_XS: (0,)}


def copy_metadata(g: GGUFFile, w: GGUFWriter, skip: tuple[str, ...] = (),
                  override: dict[str, Any] | None = None) -> None:
    """Every metadata key of g into w with its own types (but the architecture, which the
    writer sets, and `skip`); `override` replaces values."""
    override = override or {}
    for key, value in g.metadata.items():
        if key == "general.architecture" or key in skip:
            continue
        value = override.get(key, value)
        vtype, etype = g.kv_types[key]
        if vtype == GGUFValueType.ARRAY and etype != GGUFValueType.STRING:
            value = list(np.asarray(value).tolist())
        w.add_key_value(key, value, GGUFValueType(vtype),
                        None if etype is None else GGUFValueType(etype))


def describe(src: Path, dst: Path) -> Path:
    with open_gguf(src) as g:
        w = GGUFWriter(str(dst), g.arch)
        copy_metadata(g, w)
        table = [[name, list(info.shape), int(info.ggml_type)] for name, info in g.tensors.items()]
        w.add_string(SHAPES_KEY, json.dumps(table))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
    return dst


def _random(qtype: QT, shape: tuple[int, ...], rng: np.random.Generator,
            norm: bool) -> np.ndarray:
    """numpy-order tensor data (byte rows for quantized types)."""
    if norm:
        return np.ones(shape, np.float32)
    if qtype in (QT.F32, QT.F16):
        return (rng.standard_normal(shape) * 0.02).astype(
            np.float32 if qtype == QT.F32 else np.float16)
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in F16_AT.get(qtype, ()):
        v = rng.choice([-1.0, 1.0], n_blocks) * 10.0 ** rng.uniform(-3.5, -2.5, n_blocks)
        b[:, at: at + 2] = v.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(*shape[:-1], shape[-1] // block * size)


def fill(shapes: Path, dst: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with open_gguf(shapes) as g:
        table = json.loads(g.metadata[SHAPES_KEY])
        w = GGUFWriter(str(dst), g.arch)
        copy_metadata(g, w, skip=(SHAPES_KEY,))
        for name, ggml_shape, ggml_type in table:
            qtype = QT(ggml_type)
            shape = tuple(reversed(ggml_shape))
            data = _random(qtype, shape, rng, norm="norm" in name or name.endswith(".bias"))
            if qtype in (QT.F32, QT.F16) or "norm" in name or name.endswith(".bias"):
                w.add_tensor(name, data)
            else:
                w.add_tensor(name, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
    return dst


if __name__ == "__main__":
    {"describe": describe, "fill": fill}[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
