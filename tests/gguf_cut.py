"""A real GGUF model cut to its first N blocks: real weights, tokenizer and quant types in a
file small enough for the Triton interpreter on the CPU or to carry to a GPU machine
(SmolLM2-135M with 2 of its 30 blocks is ~35 MB).

    python tests/gguf_cut.py SRC DST N_BLOCKS
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter
from gguf_shapes import copy_metadata

from localinfer.gguf_file import open_gguf


def cut_blocks(src: Path, dst: Path, n_blocks: int) -> Path:
    with open_gguf(src) as g:
        arch = g.arch
        w = GGUFWriter(str(dst), arch)
        override: dict[str, object] = {f"{arch}.block_count": n_blocks}
        pattern = g.metadata.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, list):  # a per-layer list
            override[f"{arch}.attention.sliding_window_pattern"] = pattern[:n_blocks]
        copy_metadata(g, w, override=override)
        for name, info in g.tensors.items():
            if name.startswith("blk.") and int(name.split(".")[1]) >= n_blocks:
                continue
            qtype = QT(info.ggml_type)
            raw = np.asarray(g.raw(name))
            shape = tuple(reversed(info.shape))  # numpy order
            if qtype in (QT.F32, QT.F16):
                w.add_tensor(name, raw.view(np.float32 if qtype == QT.F32 else np.float16)
                             .reshape(shape))
            else:
                w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=qtype)  # byte rows
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return dst


if __name__ == "__main__":
    cut_blocks(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
