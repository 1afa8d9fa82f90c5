"""GGUFFile: a validated, memory-mapped GGUF model file (metadata, tensor infos, weight views).

open_gguf() parses the header with localinfer.gguf_parse (bounds-checked against the file size),
then checks the tensor layout: aligned offsets, every tensor inside the data section, no two
tensors overlapping. Weights are never copied: raw() and array() are read-only views of one
read-only mmap of the file, which the checks guarantee never reach past its end.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.errors import GGUFError
from localinfer.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from localinfer.gguf_parse import (
    DEFAULT_ALIGNMENT,
    MAX_ALIGNMENT,
    Header,
    RawTensorInfo,
    parse_header,
)

# Tensor types array() returns as plain numpy arrays; every other type comes back as row bytes.
# BF16 has no numpy dtype: its bit patterns come back as uint16.
_PLAIN_DTYPES: dict[int, str] = {
    GGMLQuantizationType.F32: "<f4",
    GGMLQuantizationType.F16: "<f2",
    GGMLQuantizationType.BF16: "<u2",
    GGMLQuantizationType.F64: "<f8",
    GGMLQuantizationType.I8: "<i1",
    GGMLQuantizationType.I16: "<i2",
    GGMLQuantizationType.I32: "<i4",
    GGMLQuantizationType.I64: "<i8",
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    ggml_type: int  # a GGMLQuantizationType value (ggml_types.py)
    offset: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        return self.shape[0] // block_size * type_size


class GGUFFile:
    """An open GGUF file. Build it with open_gguf(); use as a context manager or close()."""

    def __init__(self, path: Path, mm: mmap.mmap | None, file_size: int, header: Header,
                 alignment: int, data_offset: int, tensors: dict[str, TensorInfo]) -> None:
        self.path = path
        self.version = header.version
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        self.metadata: dict[str, Any] = header.metadata
        # key -> (GGUFValueType, element type for arrays else None): lets semantic checks tell
        # an int32 from a uint32 after the values became plain Python ints.
        self.kv_types: dict[str, tuple[int, int | None]] = header.kv_types
        self.tensors = tensors
        self._kv_end = header.kv_end
        self._mm = mm

    @property
    def arch(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFError(f"{self.path}: missing or invalid general.architecture")
        return arch

    def metadata_sha256(self) -> str:
        """sha256 of the header up to the last metadata entry (magic, version, counts and every
        key, type and value as stored): files with the same digest have the same metadata, so
        whatever is built from metadata alone (the tokenizer) can be cached under it."""
        if self._mm is None:
            raise GGUFError(f"{self.path}: file is closed")
        with memoryview(self._mm) as mv, mv[:self._kv_end] as head:
            return hashlib.sha256(head).hexdigest()

    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: no tensor named {name!r}")
        if self._mm is None:
            raise GGUFError(f"{self.path}: file is closed")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view of the mapped file (no copy)."""
        info = self._info(name)
        return np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def array(self, name: str) -> np.ndarray:
        """A read-only view shaped (..., rows, cols) for plain types, (..., rows, row_bytes)
        for quantized ones (each row is a whole number of blocks)."""
        info = self._info(name)
        outer = tuple(reversed(info.shape[1:]))
        dtype = _PLAIN_DTYPES.get(info.ggml_type)
        if dtype is not None:
            arr = np.frombuffer(self._mm, dtype=dtype, count=info.n_elements, offset=info.offset)
            return arr.reshape(*outer, info.shape[0])
        return self.raw(name).reshape(*outer, info.row_bytes)

    def release_pages(self) -> None:
        """Drop this process's resident pages of the mapping (they stay in the page cache).
        Called once the weights are repacked, so the mapped copy does not sit in memory beside
        the repacked one; views stay valid (a later read maps its pages again)."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if self._mm is not None and advice is not None:
            with contextlib.suppress(OSError, ValueError):
                self._mm.madvise(advice)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        _close_quietly(mm)  # views handed out keep the map alive until the last one goes

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")


def _alignment(path: Path, header: Header) -> int:
    if "general.alignment" not in header.metadata:
        return DEFAULT_ALIGNMENT
    value = header.metadata["general.alignment"]
    # llama.cpp reads this key with gguf_get_val_u32, which aborts on any other type.
    if header.kv_types["general.alignment"][0] != GGUFValueType.UINT32:
        raise GGUFError(f"{path}: general.alignment must be a uint32, got {value!r}")
    if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
        raise GGUFError(
            f"{path}: general.alignment {value} must be a power of two <= {MAX_ALIGNMENT}")
    return value


def _layout(path: Path, header: Header, alignment: int, file_size: int
            ) -> tuple[int, dict[str, TensorInfo]]:
    """Check tensor placement; return the data offset and absolute-offset tensor infos."""
    data_offset = -(-header.infos_end // alignment) * alignment
    data_size = file_size - data_offset
    if header.tensors and data_size < 0:
        raise GGUFError(f"{path}: data section would start at byte {data_offset}, past the end "
                        f"of the {file_size}-byte file (truncated?)")
    for t in header.tensors:
        if t.rel_offset % alignment:
            raise GGUFError(f"{path}: tensor {t.name!r} offset {t.rel_offset} is not a multiple "
                            f"of the alignment {alignment}")
        # Like llama.cpp, the data section must hold every tensor padded to the alignment
        # (writers pad the last tensor too), so a file cut in that padding is also caught.
        padded_end = t.rel_offset + -(-t.nbytes // alignment) * alignment
        if padded_end > data_size:
            raise GGUFError(
                f"{path}: tensor {t.name!r} ({t.nbytes} bytes at data offset {t.rel_offset}) "
                f"runs past the end of the file (data section has {max(data_size, 0)} bytes; "
                "truncated or corrupt file)")
    prev: RawTensorInfo | None = None
    for t in sorted(header.tensors, key=lambda t: t.rel_offset):
        if prev is not None and t.rel_offset < prev.rel_offset + prev.nbytes:
            raise GGUFError(f"{path}: tensors {prev.name!r} and {t.name!r} overlap")
        prev = t
    tensors = {
        t.name: TensorInfo(t.name, t.shape, t.ggml_type, data_offset + t.rel_offset, t.nbytes)
        for t in header.tensors
    }
    return data_offset, tensors


def _close_quietly(mm: mmap.mmap | None) -> None:
    if mm is not None:
        with contextlib.suppress(BufferError):  # views still use it: unmapped when they go
            mm.close()


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open and validate a GGUF file. Raises GGUFError for anything wrong, never other errors."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            # mmap of an empty file fails; parse_header reports it as empty instead.
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if file_size else None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None
    try:
        header = parse_header(mm if mm is not None else b"", file_size, path)
        alignment = _alignment(path, header)
        data_offset, tensors = _layout(path, header, alignment, file_size)
    except GGUFError:
        _close_quietly(mm)
        raise
    except (MemoryError, RecursionError) as e:  # defensive: the checks should prevent these
        _close_quietly(mm)
        raise GGUFError(f"{path}: cannot parse: {type(e).__name__}") from None
    return GGUFFile(path, mm, file_size, header, alignment, data_offset, tensors)
