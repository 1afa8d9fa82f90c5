"""GGUF headers byte by byte, and the fuzz input format that carries one.

A fuzz input is an 8-byte little-endian tail size followed by the file's head (magic to the
end of the tensor infos). The case file is the head followed by a tail of that many bytes (the
padding to the alignment, then the data section) left as a sparse hole: a real model's header
with its real tensor sizes costs no disk or time, and no check ever reads weights. Tails are
capped at DATA_CAP (a sparse file of that size is free).

The packers write exactly what they are given, so the hostile seeds can hold any count,
length, type or offset.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localinfer.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

VT = GGUFValueType
DATA_CAP = 1 << 34
_FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
        VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
        VT.FLOAT64: "<d"}


def string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def value(vtype: int, v: Any, etype: int | None = None) -> bytes:
    if vtype == VT.STRING:
        return string(v)
    if vtype == VT.ARRAY:
        assert etype is not None
        return struct.pack("<IQ", etype, len(v)) + b"".join(value(etype, x) for x in v)
    return struct.pack(_FMT[VT(vtype)], v)


def kv(key: str | bytes, vtype: int, v: Any, etype: int | None = None) -> bytes:
    return string(key) + struct.pack("<I", vtype) + value(vtype, v, etype)


def tensor_info(name: str | bytes, shape: Sequence[int], ggml_type: int, offset: int) -> bytes:
    return (string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
            + struct.pack("<IQ", ggml_type, offset))


def nbytes(shape: Sequence[int], ggml_type: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


@dataclass
class Head:
    """A header as records: edit any of them, then `encode` it."""

    kvs: list[bytes] = field(default_factory=list)
    tensors: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)
    version: int = 3
    magic: bytes = b"GGUF"
    alignment: int = 32
    n_kv: int | None = None  # None: len(kvs)
    n_tensors: int | None = None  # None: len(tensors)
    infos: list[bytes] | None = None  # raw tensor infos in place of `tensors`

    def encode(self) -> tuple[bytes, int]:
        """(the head's bytes, the tail's size: padding and data) with tensors packed in order."""
        infos, offset = [], 0
        for name, shape, ggml_type in self.tensors:
            infos.append(tensor_info(name, shape, ggml_type, offset))
            offset += -(-nbytes(shape, ggml_type) // self.alignment) * self.alignment
        if self.infos is not None:
            infos = self.infos
        n_tensors = len(infos) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        head = (self.magic + struct.pack("<IQQ", self.version, n_tensors, n_kv)
                + b"".join(self.kvs) + b"".join(infos))
        padding = -len(head) % self.alignment
        return head, padding + offset


def fuzz_input(head: bytes, data_size: int) -> bytes:
    return struct.pack("<Q", data_size) + head


def split_input(data: bytes) -> tuple[bytes, int]:
    """(head, tail size) of a fuzz input; a short input is all head, no tail."""
    if len(data) < 8:
        return data, 0
    return data[8:], min(struct.unpack_from("<Q", data)[0], DATA_CAP)
