"""GGUFFile on the real SmolLM2 file: same metadata, tensors and bytes as gguf.GGUFReader, mapped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType

from localinfer.gguf_file import open_gguf
from localinfer.model_config import ModelConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path(request: pytest.FixtureRequest) -> Path:
    try:
        path = request.getfixturevalue("smollm2_path")
    except Exception as e:  # no catalog / no network: the real-model tests cannot run
        pytest.skip(f"real model unavailable: {e}")
    if not Path(path).is_file():
        pytest.skip(f"real model not found at {path}")
    return Path(path)


@pytest.fixture(scope="module")
def reader(model_path: Path):
    import gguf

    return gguf.GGUFReader(model_path)


def test_metadata_matches_gguf_reader(model_path: Path, reader) -> None:
    with open_gguf(model_path) as g:
        keys = [k for k in reader.fields if not k.startswith("GGUF.")]
        assert list(g.metadata) == keys
        for key in keys:
            field = reader.fields[key]
            ours = g.metadata[key]
            vtype = field.types[0]
            assert g.kv_types[key][0] == vtype, key
            if vtype == GGUFValueType.ARRAY and field.types[1] == GGUFValueType.STRING:
                expected = [bytes(field.parts[i]).decode("utf-8", "surrogateescape")
                            for i in field.data]
                assert ours == expected, key
            elif vtype == GGUFValueType.ARRAY:
                expected = np.concatenate([field.parts[i] for i in field.data])
                assert ours.dtype == expected.dtype and np.array_equal(ours, expected), key
            elif vtype == GGUFValueType.STRING:
                assert ours == bytes(field.parts[field.data[0]]).decode(), key
            else:
                assert ours == field.parts[field.data[0]][0].item(), key


def test_tensors_match_gguf_reader(model_path: Path, reader) -> None:
    with open_gguf(model_path) as g:
        assert g.data_offset == reader.data_offset and g.alignment == reader.alignment
        assert list(g.tensors) == [t.name for t in reader.tensors]
        for t in reader.tensors:
            info = g.tensors[t.name]
            assert info.shape == tuple(int(d) for d in t.shape), t.name
            assert info.ggml_type == int(t.tensor_type), t.name
            assert info.offset == t.data_offset and info.nbytes == t.n_bytes, t.name
            assert np.array_equal(g.raw(t.name), t.data.reshape(-1).view(np.uint8)), t.name
        assert g.array("token_embd.weight").shape == (49152, 612)  # Q8_0 rows: 18 blocks of 34
        assert g.array("blk.0.attn_norm.weight").dtype == np.float32


def test_model_config(model_path: Path) -> None:
    with open_gguf(model_path) as g:
        cfg = ModelConfig.from_gguf(g)
        cfg.check_tensors(g)
    assert (cfg.n_layers, cfg.n_embd, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_ff) == (
        30, 576, 9, 3, 64, 1536)
    assert cfg.n_vocab == 49152 and cfg.tied_embeddings and cfg.rope_base == 1e5


_RSS_SCRIPT = """
import sys
from localinfer.gguf_file import open_gguf

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

before = rss()
g = open_gguf(sys.argv[1])
views = [g.raw(name) for name in g.tensors] + [g.array(name) for name in g.tensors]
print(rss() - before, g.file_size)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_weights_are_mapped_not_read(model_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(model_path)], check=True,
                         capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root)}).stdout
    grown, size = map(int, out.split())
    # Metadata (vocab + merges as Python strings) is ~15 MB; the 98 MB of weights stay unread.
    assert grown < size // 3, (grown, size)
