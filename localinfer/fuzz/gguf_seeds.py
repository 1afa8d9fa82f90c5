"""The GGUF fuzzer's seed corpus: cut-down real models and hostile files (RELIABILITY.md #1-#7).

A real model is cut to one block and its first `vocab` tokens (their scores, types and the
merges among them; the embedding's rows to match): its real metadata, tokenizer, chat template,
tensor names, shapes and quant types in a head of a few KB, the weights a sparse hole. Each
hostile seed is the first cut model with one thing broken, so a mutation of it starts next to
the check that refuses it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localinfer.fuzz.gguf_encode import VT, Head, fuzz_input, kv, nbytes, string, tensor_info
from localinfer.gguf_file import open_gguf

_PER_TOKEN = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def cut_model(path: Path, vocab: int = 256) -> Head:
    """One block and `vocab` tokens of the model at `path`, as header records."""
    with open_gguf(path) as g:
        arch = g.arch
        tokens = list(g.metadata.get("tokenizer.ggml.tokens", []))[:vocab]
        known = set(tokens)
        head = Head(alignment=g.alignment)
        for key, v in g.metadata.items():
            vtype, etype = g.kv_types[key]
            if key in _PER_TOKEN:
                v = list(v)[:vocab]
            elif key == "tokenizer.ggml.merges":
                v = [m for m in v if _merge_within(m, known)]
            elif key == f"{arch}.block_count":
                v = 1
            elif key.endswith("_token_id") and v >= vocab:
                continue  # a special token past the cut vocabulary
            elif vtype == VT.ARRAY and key.startswith(f"{arch}."):  # per-layer lists
                v = list(v)[:1]
            if vtype == VT.ARRAY:
                v = v.tolist() if hasattr(v, "tolist") else list(v)
            head.kvs.append(kv(key, vtype, v, etype))
        for name, info in g.tensors.items():
            if name.startswith("blk.") and not name.startswith("blk.0."):
                continue
            shape = info.shape
            if name in ("token_embd.weight", "output.weight"):
                shape = (shape[0], len(tokens))
            head.tensors.append((name, shape, info.ggml_type))
    return head


def _merge_within(merge: str, tokens: set[str]) -> bool:
    """Whether a merge "a b" joins two kept tokens into a kept one."""
    parts = merge.split(" ", 1)
    return all(p in tokens for p in (*parts, "".join(parts)))


def _edit(head: Head, **changes: Any) -> Head:
    return Head(**{**head.__dict__, "kvs": list(head.kvs), "tensors": list(head.tensors),
                   **changes})


def _set_kv(head: Head, key: str, record: bytes | None) -> Head:
    """The head with `key`'s record replaced by `record` (None: removed; added if absent)."""
    prefix = string(key)
    kvs = [r for r in head.kvs if not (r.startswith(prefix) and len(r) > len(prefix))]
    if record is not None:
        kvs.append(record)
    return _edit(head, kvs=kvs)


def _key_of(head: Head, suffix: str) -> str:
    for record in head.kvs:
        n = struct.unpack_from("<Q", record)[0]
        key = record[8:8 + n].decode()
        if key.endswith(suffix):
            return key
    raise KeyError(suffix)


def _infos(head: Head, edit: Callable[[list[tuple[str, tuple[int, ...], int, int]]], None]
           ) -> Head:
    """The head with raw tensor infos, after `edit` changed the (name, shape, type, offset)s."""
    rows, offset = [], 0
    for name, shape, ggml_type in head.tensors:
        rows.append((name, shape, ggml_type, offset))
        offset += -(-nbytes(shape, ggml_type) // head.alignment) * head.alignment
    edit(rows)
    return _edit(head, infos=[tensor_info(*row) for row in rows])


def hostile(head: Head) -> Iterator[tuple[str, bytes]]:
    """(name, fuzz input) for each hostile class, built from the valid `head`."""
    good, tail = head.encode()
    yield "1-empty", fuzz_input(b"", 0)
    yield "1-bad-magic", fuzz_input(_edit(head, magic=b"GGUX").encode()[0], tail)
    for version in (1, 4, 0xFFFFFFFF):
        yield f"1-version-{version}", fuzz_input(_edit(head, version=version).encode()[0], tail)
    for fraction in (4, 2):
        yield f"1-cut-{fraction}th", fuzz_input(good[:len(good) // fraction], 0)
    yield "1-data-short", fuzz_input(good, tail - 1)
    for count in (2**63, 2**64 - 1):
        yield f"2-tensors-{count}", fuzz_input(_edit(head, n_tensors=count).encode()[0], tail)
        yield f"2-kvs-{count}", fuzz_input(_edit(head, n_kv=count).encode()[0], tail)
    raw_kvs = {
        "3-key-huge": struct.pack("<Q", 2**63) + b"k",
        "3-key-past-end": struct.pack("<Q", 1 << 20) + b"k",
        "3-key-empty": kv(b"", VT.UINT32, 1),
        "3-key-duplicate": head.kvs[0],
        "3-string-huge": string("x.s") + struct.pack("<IQ", VT.STRING, 2**64 - 1),
        "4-array-huge": string("x.a") + struct.pack("<IIQ", VT.ARRAY, VT.UINT8, 2**63),
        "4-array-unknown-type": string("x.a") + struct.pack("<IIQ", VT.ARRAY, 99, 4),
        "4-array-nested": string("x.a") + struct.pack("<IIQ", VT.ARRAY, VT.ARRAY, 1)
        + struct.pack("<IQ", VT.UINT8, 1) + b"\0",
        "4-value-unknown-type": string("x.v") + struct.pack("<I", 99) + b"\0" * 8,
    }
    for name, record in raw_kvs.items():
        yield name, fuzz_input(_edit(head, kvs=[*head.kvs, record]).encode()[0], tail)

    def tensor_edit(name: str, fn: Callable[[list[Any]], None]) -> tuple[str, bytes]:
        return name, fuzz_input(_infos(head, fn).encode()[0], tail)

    def row(i: int, **change: Any) -> Callable[[list[Any]], None]:
        def fn(rows: list[Any]) -> None:
            name, shape, ggml_type, offset = rows[i]
            rows[i] = (change.get("name", name), change.get("shape", shape),
                       change.get("ggml_type", ggml_type), change.get("offset", offset))
        return fn

    yield tensor_edit("5-dims-0", row(0, shape=()))
    yield tensor_edit("5-dims-5", row(0, shape=(32, 1, 1, 1, 1)))
    yield tensor_edit("5-dim-zero", row(0, shape=(0,)))
    yield tensor_edit("5-dims-overflow", row(0, shape=(2**62, 2**62)))
    yield tensor_edit("5-type-unknown", row(0, ggml_type=99))
    yield tensor_edit("5-name-duplicate", lambda rows: rows.append(rows[0]))
    yield tensor_edit("5-name-long", row(0, name="t" * 64))
    yield tensor_edit("6-offset-misaligned", row(1, offset=1))
    yield tensor_edit("6-offset-past-end", row(1, offset=2**62))
    yield tensor_edit("6-overlap", row(1, offset=0))
    for align in (3, 1 << 30):
        record = kv("general.alignment", VT.UINT32, align)
        yield f"6-alignment-{align}", fuzz_input(
            _set_kv(head, "general.alignment", record).encode()[0], tail)
    arch = _key_of(head, "block_count").split(".")[0]
    semantic = {
        "7-blocks-0": kv(f"{arch}.block_count", VT.UINT32, 0),
        "7-blocks-1000": kv(f"{arch}.block_count", VT.UINT32, 1000),
        "7-heads-0": kv(f"{arch}.attention.head_count", VT.UINT32, 0),
        "7-kv-heads-7": kv(f"{arch}.attention.head_count_kv", VT.UINT32, 7),
        "7-tokens-short": kv("tokenizer.ggml.tokens", VT.ARRAY, ["a", "b"], VT.STRING),
        "7-scores-int": kv("tokenizer.ggml.scores", VT.ARRAY, [1, 2], VT.INT32),
        "7-bos-past-vocab": kv("tokenizer.ggml.bos_token_id", VT.UINT32, 1 << 30),
        "7-eos-negative": kv("tokenizer.ggml.eos_token_id", VT.INT32, -1),
        "7-arch-unknown": kv("general.architecture", VT.STRING, "nonesuch"),
        "7-context-0": kv(f"{arch}.context_length", VT.UINT32, 0),
        "7-template-loop": kv("tokenizer.chat_template", VT.STRING,
                              "{% for i in range(10**9) %}{{ i }}{% endfor %}"),
        "7-template-escape": kv("tokenizer.chat_template", VT.STRING,
                                "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    }
    for name, record in semantic.items():
        key = record[8:8 + struct.unpack_from("<Q", record)[0]].decode()
        yield name, fuzz_input(_set_kv(head, key, record).encode()[0], tail)
    yield tensor_edit("7-tensor-missing", lambda rows: rows.pop())
    yield tensor_edit("7-tensor-shape", row(len(head.tensors) - 1, shape=(32,)))


def write_corpus(folder: Path, models: list[Path], vocab: int = 256) -> list[Path]:
    """Write the seeds into `folder` (named by class and content); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    heads = [cut_model(path, vocab) for path in models]
    seeds: list[tuple[str, bytes]] = [(f"0-real-{p.stem}", fuzz_input(*h.encode()))
                                      for p, h in zip(models, heads, strict=True)]
    if heads:
        seeds += list(hostile(heads[0]))
    for name, data in seeds:
        path = folder / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}"
        path.write_bytes(data)
        written.append(path)
    return written
