"""A minimal reader for SentencePiece's tokenizer.model: the protobuf ModelProto, of which the
converter needs only the pieces (field 1: piece text, score, type). Unknown fields - trainer_spec,
normalizer_spec and the rest - are skipped by wire type, so no protobuf package is needed."""

from __future__ import annotations

import struct
from pathlib import Path

from localinfer.errors import UnsupportedModelError

# sentencepiece_model.proto: SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE, UNUSED = 1, 2, 3, 4, 6, 5
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes):
    """(field number, wire type, value) for each field of one message; LEN values as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _varint(buf, pos)
        elif wire == FIXED64:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == LEN:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == FIXED32:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def read_pieces(path: str | Path) -> list[tuple[str, float, int]]:
    """(piece, score, type) by id from a SentencePiece model file."""
    path = Path(path)
    try:
        pieces = []
        for number, wire, value in fields(path.read_bytes()):
            if number != 1 or wire != LEN:
                continue
            piece, score, kind = "", 0.0, NORMAL
            for n, w, v in fields(value):
                if n == 1 and w == LEN:
                    piece = v.decode("utf-8")
                elif n == 2 and w == FIXED32:
                    (score,) = struct.unpack("<f", v)
                elif n == 3 and w == VARINT:
                    kind = v
            pieces.append((piece, score, kind))
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise UnsupportedModelError(f"{path}: not a SentencePiece model ({exc})") from None
    if not pieces:
        raise UnsupportedModelError(f"{path}: SentencePiece model without pieces")
    return pieces
