"""A streaming GGUF v3 writer laid out byte for byte like ggml's gguf.cpp writes a file.

Header: magic, version, tensor count, KV count, the KVs in order, the tensor infos (name,
ggml_n_dims dims, type, offset), zero padding to the alignment; then each tensor's bytes, each
padded to the alignment. Sizes are known up front, so tensors stream out in order, no seeking.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALAR_FMT: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<B", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_ARRAY_DTYPE: dict[int, str] = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "<u1", GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}


@dataclass(frozen=True, slots=True)
class KV:
    key: str
    vtype: int  # GGUFValueType
    value: Any
    etype: int | None = None  # element type when vtype is ARRAY


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order, ne0 first
    ggml_type: int

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n * (self.shape[0] // block) * size


def _str(s: str, errors: str = "strict") -> bytes:
    b = s.encode("utf-8", errors)
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any, etype: int | None) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _str(value)
    if vtype == GGUFValueType.ARRAY:
        assert etype is not None
        head = struct.pack("<IQ", etype, len(value))
        if etype == GGUFValueType.STRING:  # vocabularies: lossless round trip of the bytes
            return head + b"".join(_str(s, "surrogateescape") for s in value)
        return head + np.asarray(value).astype(_ARRAY_DTYPE[etype]).tobytes()
    return struct.pack(_SCALAR_FMT[vtype], value)


def encode_header(kvs: list[KV], tensors: list[TensorSpec], alignment: int) -> bytes:
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    for kv in kvs:
        parts += [_str(kv.key), struct.pack("<I", kv.vtype), _value(kv.vtype, kv.value, kv.etype)]
    offset = 0
    for t in tensors:
        dims = list(t.shape)
        while len(dims) > 1 and dims[-1] == 1:  # ggml_n_dims drops trailing 1s
            dims.pop()
        parts += [_str(t.name), struct.pack(f"<I{len(dims)}q", len(dims), *dims),
                  struct.pack("<IQ", t.ggml_type, offset)]
        offset += -(-t.nbytes // alignment) * alignment
    head = b"".join(parts)
    return head + b"\0" * (-len(head) % alignment)


class GGUFStreamWriter:
    """Write the header now, then each tensor's bytes in order with write_tensor()."""

    def __init__(self, f: BinaryIO, kvs: list[KV], tensors: list[TensorSpec],
                 alignment: int = 32) -> None:
        self.f = f
        self.alignment = alignment
        self._pending = list(tensors)
        self._written = 0  # bytes of the current tensor so far
        f.write(encode_header(kvs, tensors, alignment))

    def write_tensor(self, name: str, data: bytes | memoryview | np.ndarray,
                     last_chunk: bool = True) -> None:
        """Append bytes of the next tensor; the chunk with last_chunk=True finishes it."""
        spec = self._pending[0]
        if spec.name != name:
            raise ValueError(f"tensor {name!r} written out of order (expected {spec.name!r})")
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        buf = memoryview(data).cast("B")
        self.f.write(buf)
        self._written += buf.nbytes
        if last_chunk:
            if self._written != spec.nbytes:
                raise ValueError(f"tensor {name!r}: wrote {self._written} bytes, "
                                 f"expected {spec.nbytes}")
            self.f.write(b"\0" * (-spec.nbytes % self.alignment))
            self._pending.pop(0)
            self._written = 0

    def finish(self) -> None:
        if self._pending:
            raise ValueError(f"{len(self._pending)} tensors were not written")
