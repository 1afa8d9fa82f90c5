"""GGUF metadata arrays of strings, bounds-checked when the header is parsed, decoded on first use.

A vocabulary is 50k-260k strings: decoding them all took 0.05-0.15 s of every start,
while a start that takes its tokenizer from the cache (localinfer/tokenizer/cache.py) never needs
them decoded.  So parsing only walks the length prefixes, checking each against the bytes left
exactly as a full decode would (same GGUFError, same message), and copies the array's bytes; a
StringArray decodes them the first time an element is asked for.  Decoding cannot fail then: every
length was checked, and the bytes are a private copy, not a view of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from localinfer.gguf_parse import Cursor

_U64 = struct.Struct("<Q")


class StringArray(Sequence[str]):
    """An immutable list of strings decoded lazily from their GGUF encoding (each a u64 byte
    length then UTF-8).  len() is free; indexing, iteration or comparison decode every string
    once.  Slices come back as plain lists, equality holds with a list or tuple of the same
    strings, as it did when the parser returned lists."""

    __slots__ = ("_data", "_n", "_items")

    def __init__(self, data: bytes, n: int) -> None:
        self._data: bytes | None = data  # n length-prefixed strings, already bounds-checked
        self._n = n
        self._items: list[str] | None = None

    def to_list(self) -> list[str]:
        """A new list of the strings (decoding them the first time)."""
        return list(self._decoded())

    def _decoded(self) -> list[str]:
        items = self._items
        if items is None:
            data = self._data
            if data is None:  # another thread decoded it since: _items is set before this
                return self._items  # type: ignore[return-value]
            items = self._items = _decode(data, self._n)
            self._data = None  # the strings hold the text now
        return items

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self._decoded()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __contains__(self, value: object) -> bool:
        return value in self._decoded()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._n == other._n and self._decoded() == other._decoded()
        if isinstance(other, list | tuple):
            return self._n == len(other) and self._decoded() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like list: equal to lists, so unhashable

    def __repr__(self) -> str:
        return repr(self._decoded())  # what the parser's plain lists printed


def read_string_array(cur: Cursor, n: int, key: str) -> StringArray:
    """The `n` strings at the cursor (just past the array's length), bounds-checked; the cursor
    moves past them.  Raises the GGUFError a full decode would raise."""
    start = cur.pos
    end = _skip(cur.buf, start, cur.end, n)
    if end is None:
        _raise_bounds_error(cur, n, key)
    cur.pos = end
    return StringArray(bytes(cur.buf[start:end]), n)


def _skip(buf: object, pos: int, end: int, n: int) -> int | None:
    """The offset just past `n` length-prefixed strings at `pos`, or None when one of them
    (its length or its bytes) reaches past `end`.  The hot loop of every start: one unpack and
    one comparison per string (a length field read past `end` leaves pos > end as well)."""
    unpack = _U64.unpack_from
    try:
        for _ in range(n):
            pos += 8 + unpack(buf, pos)[0]
            if pos > end:
                return None
    except struct.error:  # a length field past the end of the buffer
        return None
    return pos


def _raise_bounds_error(cur: Cursor, n: int, key: str) -> None:
    """Find the first string that does not fit and raise its error (the slow, exact walk)."""
    buf, pos, end = cur.buf, cur.pos, cur.end
    unpack = _U64.unpack_from
    for i in range(n):
        if end - pos < 8:
            cur.pos = pos
            raise cur.error(f"metadata {key}: string {i} of {n} runs past the end of the file")
        length = unpack(buf, pos)[0]
        if length > end - pos - 8:
            cur.pos = pos
            raise cur.error(f"metadata {key}: string {i} is {length} bytes, past the end of file")
        pos += 8 + length
    raise AssertionError("_skip and _raise_bounds_error disagree")  # pragma: no cover


def _decode(data: bytes, n: int) -> list[str]:
    # "surrogateescape" makes the decoding lossless: s.encode("utf-8", "surrogateescape") gives
    # back exactly the bytes llama.cpp keeps for the token, and valid UTF-8 (every real vocab)
    # decodes the same as with any other error handler.
    unpack = _U64.unpack_from
    out: list[str] = []
    append = out.append
    pos = 0
    for _ in range(n):
        length = unpack(data, pos)[0]
        pos += 8
        append(data[pos:pos + length].decode("utf-8", "surrogateescape"))
        pos += length
    return out
