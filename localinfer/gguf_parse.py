"""Bounds-checked parsing of a GGUF header: magic, version, KV metadata and tensor infos.

Every count, length and offset read from the file is a Python int that is checked against the
bytes actually left before anything is allocated or looped over, so a hostile file (2^64-1
counts, 2^63 array lengths, strings past the end) fails fast with a GGUFError and little memory.
This is deliberately not gguf.GGUFReader, which trusts those numbers.  Arrays of strings come
back as gguf_strings.StringArray: checked here, decoded on first use.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from localinfer.errors import GGUFError
from localinfer.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from localinfer.gguf_strings import read_string_array

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # larger alignments only waste space; treat them as hostile
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_KEY_BYTES = 1 << 16
MAX_ELEMENTS = 1 << 62  # no real tensor comes near; keeps every size product far from int64
# Metadata is small in every real model (Gemma 3's 262,144-token vocabulary and scores: 6.5 MB
# of header; Llama 3's vocabulary and 280k merges: ~8 MB; the largest vocabularies and merge
# lists have well under a million entries; chat templates are KBs). A file that fits its counts
# and lengths into gigabytes of its own bytes (a sparse file is free to make) is hostile: the
# header (metadata and tensor infos) must end within MAX_HEADER_BYTES, an array hold at most
# MAX_ARRAY_ELEMENTS and a string value at most MAX_STRING_BYTES, so parsing copies and loops
# over little (a 64 MiB header of strings took over 1 s to decode on a busy machine).
MAX_HEADER_BYTES = 32 << 20
MAX_ARRAY_ELEMENTS = 1 << 21
MAX_STRING_BYTES = 1 << 20

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Scalar value types: struct format, size in bytes, numpy dtype for arrays of them.
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), "<u1"),
    GGUFValueType.INT8: (struct.Struct("<b"), "<i1"),
    GGUFValueType.UINT16: (struct.Struct("<H"), "<u2"),
    GGUFValueType.INT16: (struct.Struct("<h"), "<i2"),
    GGUFValueType.UINT32: (struct.Struct("<I"), "<u4"),
    GGUFValueType.INT32: (struct.Struct("<i"), "<i4"),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), "<f4"),
    GGUFValueType.BOOL: (struct.Struct("<B"), "<u1"),
    GGUFValueType.UINT64: (struct.Struct("<Q"), "<u8"),
    GGUFValueType.INT64: (struct.Struct("<q"), "<i8"),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), "<f8"),
}
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)

# Smallest encodings, used to bound counts by the bytes left: a KV is a non-empty key
# (8-byte length + 1 byte), a 4-byte type and a value of at least 1 byte; a tensor info is a
# name (8 + 1), n_dims (4), one dim (8), a type (4) and an offset (8).
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


@dataclass(frozen=True, slots=True)
class RawTensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    rel_offset: int  # relative to the start of the data section
    nbytes: int


@dataclass(slots=True)
class Header:
    version: int
    metadata: dict[str, Any]
    kv_types: dict[str, tuple[int, int | None]]  # key -> (value type, array element type)
    tensors: list[RawTensorInfo]
    kv_end: int  # file offset just past the last metadata entry
    infos_end: int  # file offset just past the last tensor info


class Cursor:
    """A read position in a buffer that refuses to read past its end."""

    __slots__ = ("buf", "pos", "end", "path", "size")

    def __init__(self, buf: Any, end: int, path: object) -> None:
        self.buf, self.pos, self.end, self.path = buf, 0, end, path
        self.size = end  # the file's size; `end` may stop short of it (MAX_HEADER_BYTES)

    def error(self, msg: str, at: int | None = None) -> GGUFError:
        return GGUFError(f"{self.path}: {msg} (at byte {self.pos if at is None else at})")

    @property
    def left(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            if self.end < self.size:
                raise self.error(f"{what} needs {n} bytes, past the first "
                                 f"{MAX_HEADER_BYTES >> 20} MiB, where the header must end")
            raise self.error(
                f"{what} needs {n} bytes but only {self.end - self.pos} are left "
                "(truncated or corrupt file)"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        value = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        value = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def raw_string(self, what: str, max_len: int | None = None) -> bytes:
        start = self.pos
        n = self.u64(f"{what} length")
        if max_len is not None and n > max_len:
            raise self.error(f"{what} is {n} bytes long, more than the limit of {max_len}", start)
        self.need(n, what)
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return data

    def name(self, what: str, max_len: int) -> str:
        """A key or tensor name: non-empty, bounded, valid UTF-8."""
        start = self.pos
        data = self.raw_string(what, max_len)
        if not data:
            raise self.error(f"empty {what}", start)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} {data!r} is not valid UTF-8", start) from None


def _value(cur: Cursor, vtype: int, key: str) -> Any:
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        fmt = scalar[0]
        cur.need(fmt.size, f"value of {key}")
        value = fmt.unpack_from(cur.buf, cur.pos)[0]
        cur.pos += fmt.size
        if vtype == GGUFValueType.BOOL:
            return value != 0
        return float(value) if vtype in _FLOATS else value
    if vtype == GGUFValueType.STRING:
        # Scalar strings (names, chat templates) are for display and jinja: "replace" keeps them
        # printable; an invalid byte can only come from a broken or hostile file anyway.
        return cur.raw_string(f"string value of {key}", MAX_STRING_BYTES).decode("utf-8", "replace")
    if vtype == GGUFValueType.ARRAY:
        return _array(cur, key)
    raise cur.error(f"metadata {key} has unknown value type {vtype}", cur.pos - 4)


def _array(cur: Cursor, key: str) -> Any:
    start = cur.pos
    etype = cur.u32(f"element type of {key}")
    n = cur.u64(f"array length of {key}")
    if etype == GGUFValueType.ARRAY:
        # llama.cpp cannot use arrays of arrays either; refusing them also rules out recursion.
        raise cur.error(f"metadata {key} is a nested array (arrays of arrays are not supported)",
                        start)
    if etype == GGUFValueType.STRING:
        if n > cur.left // 8:
            raise cur.error(f"metadata {key}: {n} strings cannot fit in the {cur.left} bytes left",
                            start)
        _check_length(cur, n, key, start)
        return read_string_array(cur, n, key)  # decoded on first use
    scalar = _SCALARS.get(etype)
    if scalar is None:
        raise cur.error(f"metadata {key} has an array of unknown element type {etype}", start)
    dtype = np.dtype(scalar[1])
    if n > cur.left // dtype.itemsize:
        raise cur.error(f"metadata {key}: array of {n} elements runs past the end of the file",
                        start)
    _check_length(cur, n, key, start)
    arr = np.frombuffer(cur.buf, dtype=dtype, count=n, offset=cur.pos).copy()
    cur.pos += n * dtype.itemsize
    if etype == GGUFValueType.BOOL:
        return arr != 0
    return arr.astype(dtype.newbyteorder("="), copy=False)


def _check_length(cur: Cursor, n: int, key: str, start: int) -> None:
    if n > MAX_ARRAY_ELEMENTS:
        raise cur.error(f"metadata {key}: array of {n} elements, more than the limit of "
                        f"{MAX_ARRAY_ELEMENTS}", start)


def _tensor_info(cur: Cursor, seen: set[str]) -> RawTensorInfo:
    start = cur.pos
    name = cur.name("tensor name", MAX_NAME_BYTES)
    if name in seen:
        raise cur.error(f"duplicate tensor name {name!r}", start)
    n_dims = cur.u32(f"n_dims of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.error(f"tensor {name!r} has {n_dims} dimensions (must be 1..{MAX_DIMS})", start)
    cur.need(8 * n_dims, f"dims of tensor {name!r}")
    shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    n_elements = 1
    for d in shape:
        if d == 0 or d >= MAX_ELEMENTS:
            raise cur.error(f"tensor {name!r} has invalid shape {list(shape)}", start)
        n_elements *= d  # Python ints: no wrap-around, checked right after
        if n_elements > MAX_ELEMENTS:
            raise cur.error(f"tensor {name!r} shape {list(shape)} has too many elements", start)
    ggml_type = cur.u32(f"type of tensor {name!r}")
    sizes = _type_sizes(ggml_type)
    if sizes is None:
        raise cur.error(f"tensor {name!r} has unknown ggml type {ggml_type}", start)
    block_size, type_size = sizes
    if shape[0] % block_size:
        raise cur.error(
            f"tensor {name!r} rows of {shape[0]} elements are not a multiple of the "
            f"{GGMLQuantizationType(ggml_type).name} block size {block_size}", start)
    rel_offset = cur.u64(f"offset of tensor {name!r}")
    seen.add(name)
    return RawTensorInfo(name, tuple(shape), ggml_type, rel_offset,
                         n_elements // block_size * type_size)


def _type_sizes(ggml_type: int) -> tuple[int, int] | None:
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None


def parse_header(buf: Any, size: int, path: object) -> Header:
    """Parse everything before the data section; raise GGUFError on anything malformed."""
    cur = Cursor(buf, size, path)
    if size == 0:
        raise cur.error("empty file, not a GGUF model")
    cur.need(4, "magic")
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.error(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})", 0)
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (big-endian files are not supported)" if version in (0x2000000, 0x3000000) else ""
        raise cur.error(f"unsupported GGUF version {version}{hint}; supported: 2, 3", 4)
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    cur.end = min(size, MAX_HEADER_BYTES)
    # Both counts bounded by the bytes left before anything is allocated or looped over.
    if n_kv > cur.left // MIN_KV_BYTES or n_tensors > cur.left // MIN_TENSOR_INFO_BYTES or (
        n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > cur.left
    ):
        raise cur.error(
            f"header claims {n_tensors} tensors and {n_kv} metadata entries, which cannot fit "
            f"in a {size}-byte file", 8)

    metadata: dict[str, Any] = {}
    kv_types: dict[str, tuple[int, int | None]] = {}
    for _ in range(n_kv):
        start = cur.pos
        key = cur.name("metadata key", MAX_KEY_BYTES)
        if key in metadata:
            raise cur.error(f"duplicate metadata key {key!r}", start)
        vtype = cur.u32(f"value type of {key}")
        etype = None
        if vtype == GGUFValueType.ARRAY:
            cur.need(4, f"element type of {key}")
            etype = _U32.unpack_from(buf, cur.pos)[0]
        metadata[key] = _value(cur, vtype, key)
        kv_types[key] = (vtype, etype)

    kv_end = cur.pos
    seen: set[str] = set()
    tensors = [_tensor_info(cur, seen) for _ in range(n_tensors)]
    return Header(version, metadata, kv_types, tensors, kv_end, cur.pos)
