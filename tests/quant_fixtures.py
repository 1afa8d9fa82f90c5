"""Test inputs for the quantizer: an F16 GGUF made by dequantizing SmolLM2 (our reader +
gguf.quants.dequantize + gguf.GGUFWriter), and llama.cpp's quantization of a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import dequantize
from gguf_shapes import copy_metadata

from localinfer.gguf_file import open_gguf


def write_f16_gguf(src: Path, dst: Path) -> None:
    """Every 2-D tensor as F16 (1-D norms stay F32), same metadata, general.file_type = 1."""
    with open_gguf(src) as g:
        w = GGUFWriter(str(dst), g.arch)
        copy_metadata(g, w, skip=("general.file_type",))
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
                   allow_requantize: bool = False,
                   imatrix: dict[str, np.ndarray] | None = None) -> None:
    """llama_model_quantize; imatrix: name -> per-column weights (in_sum2 / counts), handed
    over as the C array of llama_model_imatrix_data that llama-quantize builds."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.pure = pure
    params.allow_requantize = allow_requantize
    keep = []  # the arrays must outlive the call
    if imatrix is not None:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for e, (name, w) in zip(entries, imatrix.items(), strict=False):  # + terminator
            arr = np.ascontiguousarray(w, dtype=np.float32)
            keep.append(arr)
            e.name = name.encode()
            e.data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            e.size = arr.size
        entries[len(imatrix)].name = None  # terminator
        keep.append(entries)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc})")


def shared_f16(smollm2: Path, base: Path) -> Path:
    """The F16 SmolLM2 under pytest's session temp dir, written once for all test modules."""
    path = base / "shared-smollm2-f16.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        write_f16_gguf(smollm2, tmp)
        tmp.rename(path)
    return path
