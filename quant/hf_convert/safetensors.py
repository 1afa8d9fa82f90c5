"""A minimal safetensors reader: an 8-byte little-endian header length, a JSON header mapping
each tensor name to {dtype, shape, data_offsets} (relative to the end of the header), then the
raw little-endian data. Tensors come back as read-only numpy views of a memory map."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from localinfer.errors import GGUFError

# safetensors dtype -> numpy dtype (BF16 as its raw uint16 bits)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "u1"}
MAX_HEADER = 100 << 20


class SafetensorsFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = self.path.stat().st_size
            head = f.read(8)
            if len(head) < 8:
                raise GGUFError(f"{self.path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise GGUFError(f"{self.path}: invalid safetensors header length {n}")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise GGUFError(f"{self.path}: invalid safetensors header: {exc}") from None
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._base = 8 + n
        self.tensors: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype, shape = info["dtype"], tuple(int(d) for d in info["shape"])
                start, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise GGUFError(f"{self.path}: malformed entry for tensor {name!r}") from None
            if dtype not in DTYPES:
                raise GGUFError(f"{self.path}: tensor {name}: unsupported dtype {dtype}")
            want = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
            if not 0 <= start <= end <= size - self._base or end - start != want:
                raise GGUFError(f"{self.path}: tensor {name}: data offsets out of range")
            self.tensors[name] = (dtype, shape, start, end)

    def dtype(self, name: str) -> str:
        return self.tensors[name][0]

    def array(self, name: str) -> np.ndarray:
        """The tensor in HF (row-major) shape; BF16 as uint16 bits."""
        dtype, shape, start, end = self.tensors[name]
        if self._map is None or start == end:
            return np.zeros(shape, DTYPES[dtype])
        return np.frombuffer(self._map, DTYPES[dtype], (end - start) // np.dtype(
            DTYPES[dtype]).itemsize, self._base + start).reshape(shape)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()


def write_safetensors(path: str | Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """name -> (safetensors dtype, array); for tests and tools that build HF directories."""
    header: dict[str, object] = {}
    offset = 0
    blobs = []
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr, DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            f.write(b)
