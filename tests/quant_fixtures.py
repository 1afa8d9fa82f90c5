"""Test inputs for the quantizer: an F16 GGUF made by dequantizing SmolLM2 (our reader +
gguf.quants.dequantize + gguf.GGUFWriter), and llama.cpp's quantization of a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter
from gguf.quants import dequantize

from localinfer.gguf_file import open_gguf


def write_f16_gguf(src: Path, dst: Path) -> None:
    """Every 2-D tensor as F16 (1-D norms stay F32), same metadata, general.file_type = 1."""
    with open_gguf(src) as g:
        w = GGUFWriter(str(dst), g.arch)
        for key, value in g.metadata.items():
            if key in ("general.architecture", "general.file_type"):
                continue
            vtype, etype = g.kv_types[key]
            if vtype == GGUFValueType.ARRAY and etype != GGUFValueType.STRING:
                value = list(np.asarray(value).tolist())
            w.add_key_value(key, value, GGUFValueType(vtype),
                            None if etype is None else GGUFValueType(etype))
        w.add_uint32("general.file_type", 1)
        for name, info in g.tensors.items():
            arr = dequantize(g.raw(name), T(info.ggml_type)).reshape(tuple(reversed(info.shape)))
            arr = arr.astype(np.float16 if len(info.shape) > 1 else np.float32)
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def llama_quantize(src: Path, dst: Path, ftype: int, nthread: int = 2, pure: bool = False,
                   allow_requantize: bool = False) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.pure = pure
    params.allow_requantize = allow_requantize
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc})")
