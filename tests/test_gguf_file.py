"""GGUFFile on small crafted files: valid ones read right, every hostile class is a GGUFError."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_factory import (
    QT,
    VT,
    TensorSpec,
    build_gguf,
    gguf_string,
    kv,
    tensor_info,
    tiny_llama_parts,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localinfer.errors import GGUFError, UnsupportedModelError
from localinfer.gguf_file import GGUFFile, open_gguf
from localinfer.gguf_parse import parse_header
from localinfer.gguf_strings import StringArray
from localinfer.model_config import ModelConfig

BIG = (1 << 63, (1 << 64) - 1)


def small_kvs() -> list[tuple]:
    return [
        ("general.architecture", VT.STRING, "llama"),
        ("general.name", VT.STRING, "tiny"),
        ("x.u8", VT.UINT8, 200),
        ("x.i64", VT.INT64, -5),
        ("x.f32", VT.FLOAT32, 0.5),
        ("x.bool", VT.BOOL, True),
        ("x.strings", VT.ARRAY, ["a", "bc", ""], VT.STRING),
        ("x.floats", VT.ARRAY, [1.0, 2.5], VT.FLOAT32),
        ("x.ints", VT.ARRAY, [1, -2, 3], VT.INT32),
    ]


def small_tensors() -> list[TensorSpec]:
    f32 = np.arange(12, dtype=np.float32).tobytes()
    return [TensorSpec("a.weight", (4, 3), QT.F32, f32), TensorSpec("b.weight", (32, 2), QT.Q8_0),
            TensorSpec("c.weight", (5,), QT.F16)]


def small_file(**kw) -> bytes:
    return build_gguf(small_kvs(), small_tensors(), **kw)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_valid_small_file(tmp_path: Path) -> None:
    with open_gguf(write(tmp_path, small_file())) as g:
        assert isinstance(g, GGUFFile) and g.version == 3 and g.alignment == 32
        assert g.arch == "llama"
        m = g.metadata
        assert (m["x.u8"], m["x.i64"], m["x.f32"], m["x.bool"]) == (200, -5, 0.5, True)
        assert m["x.strings"] == ["a", "bc", ""]
        assert m["x.floats"].dtype == np.float32 and m["x.floats"].tolist() == [1.0, 2.5]
        assert m["x.ints"].dtype == np.int32 and m["x.ints"].tolist() == [1, -2, 3]
        assert list(g.tensors) == ["a.weight", "b.weight", "c.weight"]
        a = g.tensors["a.weight"]
        assert (a.shape, a.type_name, a.n_elements, a.nbytes) == ((4, 3), "F32", 12, 48)
        assert a.offset == g.data_offset and g.data_offset % 32 == 0
        arr = g.array("a.weight")
        assert arr.shape == (3, 4) and arr.dtype == np.float32 and arr[2, 3] == 11.0
        assert not arr.flags.writeable
        assert g.array("b.weight").shape == (2, 34) and g.array("b.weight").dtype == np.uint8
        assert g.array("c.weight").dtype == np.float16 and g.array("c.weight").shape == (5,)
        assert g.raw("b.weight").nbytes == 68
        assert np.shares_memory(g.raw("a.weight"), g.array("a.weight"))
        view = g.raw("a.weight")
    assert view[0] == 0  # a view taken before close() stays valid
    with pytest.raises(GGUFError, match="closed"):
        g.raw("a.weight")


def test_gguf_writer_file_and_alignment(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_array("x.tokens", ["<s>", "é", "\u2581hi"])
    w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("u", np.ones(7, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = open_gguf(path)
    assert g.alignment == 64 and g.metadata["x.tokens"] == ["<s>", "é", "\u2581hi"]
    assert g.array("t").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert g.tensors["u"].offset % 64 == 0
    g.close()


def test_invalid_utf8_token_is_lossless(tmp_path: Path) -> None:
    data = build_gguf([("general.architecture", VT.STRING, "llama"),
                       ("t", VT.ARRAY, [b"\xff\xfe", b"ok"], VT.STRING)], small_tensors())
    with open_gguf(write(tmp_path, data)) as g:
        assert g.metadata["t"][0].encode("utf-8", "surrogateescape") == b"\xff\xfe"


def test_string_arrays_decode_on_first_use(tmp_path: Path) -> None:
    with open_gguf(write(tmp_path, small_file())) as g:
        strings = g.metadata["x.strings"]
    assert isinstance(strings, StringArray) and len(strings) == 3
    # a private copy of the bytes: still readable once the file is closed
    assert strings == ["a", "bc", ""] and strings == ("a", "bc", "") and list(strings) == \
        ["a", "bc", ""]
    assert strings[1] == "bc" and strings[:2] == ["a", "bc"] and "bc" in strings
    assert repr(strings) == "['a', 'bc', '']" and strings != ["a"]
    copy = strings.to_list()
    copy.append("d")
    assert len(strings) == 3 and strings.to_list() == ["a", "bc", ""]


def test_metadata_digest_covers_the_metadata_only(tmp_path: Path) -> None:
    def digest(kvs: list[tuple], tensors: list[TensorSpec], name: str) -> str:
        with open_gguf(write(tmp_path, build_gguf(kvs, tensors), name)) as g:
            return g.metadata_sha256()

    other_data = [TensorSpec(t.name, t.shape, t.ggml_type, None) for t in small_tensors()]
    base = digest(small_kvs(), small_tensors(), "a.gguf")
    assert digest(small_kvs(), other_data, "b.gguf") == base
    changed = [("x.strings", VT.ARRAY, ["a", "bd", ""], VT.STRING) if k[0] == "x.strings"
               else k for k in small_kvs()]
    assert digest(changed, small_tensors(), "c.gguf") != base
    g = open_gguf(tmp_path / "a.gguf")
    g.close()
    with pytest.raises(GGUFError, match="closed"):
        g.metadata_sha256()


def test_name_of_63_bytes_is_fine(tmp_path: Path) -> None:
    data = build_gguf(small_kvs(), [TensorSpec("n" * 63, (4,))])
    with open_gguf(write(tmp_path, data)) as g:
        assert list(g.tensors) == ["n" * 63]


def test_not_found_and_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot open"):
        open_gguf(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="not a regular file"):
        open_gguf(tmp_path)


def _header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _one_kv(raw: bytes) -> bytes:
    return _header(0, 1) + raw + b"\0" * 64


def _tensor(name=b"t", shape=(4,), ggml_type=QT.F32, offset=0, extra=()) -> bytes:
    """A file with one tensor info (plus extra infos) and 256 bytes of data."""
    infos = tensor_info(name, shape, ggml_type, offset) + b"".join(extra)
    arch = kv("general.architecture", VT.STRING, "llama")
    head = _header(1 + len(extra), 1) + arch + infos
    return head + bytes(-len(head) % 32) + bytes(256)


def _nested(depth: int) -> bytes:
    return gguf_string("k") + struct.pack("<I", VT.ARRAY) + struct.pack("<IQ", VT.ARRAY, 1) * depth


HOSTILE: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "empty file"),
    "short magic": (b"GG", "magic needs"),
    "bad magic": (b"GGML" + small_file()[4:], "not a GGUF file"),
    "version 1": (_header(0, 0, 1), "unsupported GGUF version 1"),
    "version 4": (_header(0, 0, 4), "unsupported GGUF version 4"),
    "big endian": (_header(0, 0, 0x3000000), "big-endian"),
    "header cut": (_header(0, 0)[:20], "metadata count needs"),
    **{f"n_tensors {n}": (_header(n, 0) + bytes(64), "cannot fit") for n in BIG},
    **{f"n_kv {n}": (_header(0, n) + bytes(64), "cannot fit") for n in BIG},
    "n_kv past end": (_header(0, 3) + kv("a", VT.UINT8, 1) + kv("b", VT.UINT8, 1)
                      + struct.pack("<Q", 20) + bytes(6), "metadata key needs"),
    "key length huge": (_header(0, 1) + struct.pack("<Q", (1 << 64) - 1) + bytes(32), "limit"),
    "key past end": (_header(0, 1) + struct.pack("<Q", 100) + bytes(32), "metadata key needs"),
    "empty key": (_one_kv(kv("", VT.UINT8, 1)), "empty metadata key"),
    "key not utf8": (_one_kv(kv(b"\xff", VT.UINT8, 1)), "not valid UTF-8"),
    "duplicate key": (_header(0, 2) + kv("a", VT.UINT8, 1) * 2 + bytes(32), "duplicate"),
    "unknown value type": (_one_kv(gguf_string("k") + struct.pack("<I", 13)), "unknown value"),
    "string 2^63": (_one_kv(gguf_string("k") + struct.pack("<IQ", VT.STRING, 1 << 63)),
                    "more than the limit"),
    **{f"array {n}": (_one_kv(gguf_string("k") + struct.pack("<IIQ", VT.ARRAY, VT.UINT32, n)),
                      "past the end") for n in BIG},
    **{f"string array {n}": (_one_kv(gguf_string("k") + struct.pack("<IIQ", VT.ARRAY,
                                                                       VT.STRING, n)),
                             "cannot fit") for n in BIG},
    "string in array past end": (_one_kv(gguf_string("k") + struct.pack("<IIQQ", VT.ARRAY,
                                                                          VT.STRING, 2, 1 << 40)),
                                 "string 0"),
    "string length cut in array": (_header(0, 1) + gguf_string("k") + struct.pack(
        "<IIQ", VT.ARRAY, VT.STRING, 2) + gguf_string("ab") + bytes(6), "string 1 of 2 runs past"),
    "second string past end": (_header(0, 1) + gguf_string("k") + struct.pack(
        "<IIQ", VT.ARRAY, VT.STRING, 2) + gguf_string("ab") + struct.pack("<Q", 100) + b"xy",
        "string 1 is 100 bytes"),
    "array elem type unknown": (_one_kv(gguf_string("k") + struct.pack("<IIQ", VT.ARRAY, 77, 1)),
                                "unknown element type"),
    "nested array": (_one_kv(_nested(1)), "nested"),
    "deeply nested array": (_header(0, 1) + _nested(100_000), "nested"),
    "n_dims 0": (_tensor(shape=()), "0 dimensions"),
    "n_dims 5": (_tensor(shape=(1, 1, 1, 1, 1)), "5 dimensions"),
    "zero dim": (_tensor(shape=(4, 0)), "invalid shape"),
    "dim 2^64-1": (_tensor(shape=((1 << 64) - 1,)), "invalid shape"),
    "dim product overflow": (_tensor(shape=(1 << 32, 1 << 32, 1 << 32)), "too many elements"),
    "unknown ggml type": (_tensor(ggml_type=1000), "unknown ggml type 1000"),
    "removed ggml type 4": (_tensor(ggml_type=4), "unknown ggml type 4"),
    "row not block multiple": (_tensor(shape=(33,), ggml_type=QT.Q8_0), "block size 32"),
    "duplicate tensor": (_tensor(extra=[tensor_info("t", (4,), QT.F32, 32)]), "duplicate tensor"),
    "name 64 bytes": (_tensor(name=b"n" * 64), "limit of 63"),
    "empty tensor name": (_tensor(name=b""), "empty tensor name"),
    "tensor name huge": (_tensor(name=b"x") .replace(struct.pack("<Q", 1) + b"x",
                                                    struct.pack("<Q", 1 << 63) + b"x"), "limit"),
    "misaligned offset": (_tensor(offset=4), "not a multiple of the alignment"),
    "offset past end": (_tensor(offset=1 << 40), "past the end"),
    "offset wraps": (_tensor(offset=(1 << 64) - 32), "past the end"),
    "size past end": (_tensor(shape=(1024,)), "past the end"),
    "overlap": (_tensor(shape=(16,), extra=[tensor_info("u", (4,), QT.F32, 32)]), "overlap"),
    "data section past end": (_tensor()[:-256 - 20], "past the end"),
}


def _alignment_file(vtype: int, value: int) -> bytes:
    return build_gguf([("general.alignment", vtype, value)], [TensorSpec("t", (4,))])


HOSTILE |= {
    "alignment 0": (_alignment_file(VT.UINT32, 0), "power of two"),
    "alignment 3": (_alignment_file(VT.UINT32, 3), "power of two"),
    "alignment 2^31": (_alignment_file(VT.UINT32, 1 << 31), "power of two"),
    "alignment uint64": (_alignment_file(VT.UINT64, 32), "must be a uint32"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile(tmp_path: Path, case: str) -> None:
    data, message = HOSTILE[case]
    path = write(tmp_path, data)
    with pytest.raises(GGUFError, match=message) as err:
        open_gguf(path)
    assert str(path) in str(err.value)


def test_truncation_sweep(tmp_path: Path) -> None:
    data = small_file()
    path = tmp_path / "cut.gguf"
    open_gguf(write(tmp_path, data, "whole.gguf")).close()
    for cut in range(len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError):
            open_gguf(path)


def test_truncation_sweep_tiny_llama(tmp_path: Path) -> None:
    data = build_gguf(*tiny_llama_parts(n_layers=1, weight_type=QT.Q4_1))
    with open_gguf(write(tmp_path, data, "whole.gguf")) as g:
        header_end = g.data_offset
    path = tmp_path / "cut.gguf"
    for cut in [*range(0, header_end, 3), *range(header_end, len(data), 509), len(data) - 1]:
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError):
            open_gguf(path)


_FUZZ_BASE = build_gguf(*tiny_llama_parts(n_layers=1, weight_type=QT.Q4_1))
_FUZZ_HEADER = parse_header(_FUZZ_BASE, len(_FUZZ_BASE), "fuzz").infos_end  # most mutations go here
_INTERESTING = [0, 1, 0x7F, 0xFF, 1 << 31, 1 << 32, 1 << 62, 1 << 63, (1 << 64) - 1]

_mutation = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, _FUZZ_HEADER) | st.integers(0, len(_FUZZ_BASE) - 1),
              st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, _FUZZ_HEADER),
              st.sampled_from(_INTERESTING) | st.integers(0, (1 << 64) - 1)),
    st.tuples(st.just("cut"), st.integers(0, len(_FUZZ_BASE) - 1), st.just(0)),
)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_mutation, min_size=1, max_size=6))
def test_fuzz_mutations(mutations: list[tuple[str, int, int]]) -> None:
    data = bytearray(_FUZZ_BASE)
    for kind, pos, value in mutations:
        if kind == "byte" and pos < len(data):
            data[pos] = value
        elif kind == "u64" and pos + 8 <= len(data):
            data[pos:pos + 8] = struct.pack("<Q", value)
        elif kind == "cut":
            del data[pos:]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.gguf"
        path.write_bytes(bytes(data))
        try:
            g = open_gguf(path)
        except GGUFError:
            return
        with g:
            for name in g.tensors:  # every view must lie inside the file: touch both ends
                raw = g.raw(name)
                int(raw[0]) + int(raw[-1])
                g.array(name)
            try:
                cfg = ModelConfig.from_gguf(g)
                cfg.check_tensors(g)
            except (GGUFError, UnsupportedModelError):
                pass
