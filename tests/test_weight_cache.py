"""The repacked-weight cache (localinfer/weight_cache.py) under the real Numba runner: a cached
load gives the same bits as a fresh repack on every kernel path, a second load maps the entry
instead of repacking, bad or stale entries are rebuilt, and concurrent writers never leave a
mixed entry."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from gguf_factory import QT, write_tiny_gemma3, write_tiny_llama

pytest.importorskip("numba")

from localinfer.backends.numba_cpu.isa import resolve_isa  # noqa: E402
from localinfer.backends.numba_cpu.quants import (  # noqa: E402
    FORMATS,
    KIND_Q4,
    KIND_Q5,
    unpack_tensor,
)

from localinfer import paths, weight_cache  # noqa: E402
from localinfer.engine.batch import ScheduledBatch  # noqa: E402
from localinfer.gguf_file import open_gguf  # noqa: E402
from localinfer.model_config import ModelConfig  # noqa: E402

BLOCK = 16
TOKENS = [5, 17, 3, 42, 99, 7, 64, 12, 250, 31]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "weights"
    monkeypatch.setattr(paths, "weight_cache_dir", lambda: folder)
    monkeypatch.delenv("LOCALINFER_WEIGHT_CACHE", raising=False)
    return folder


def isas() -> list[str]:
    native = resolve_isa("auto")
    return ["generic"] + [i for i in ("avx2", "avx512") if i == native or
                          (i == "avx2" and native == "avx512")]


def run(path: Path, isa: str) -> tuple[np.ndarray, bool]:
    """Logits of every position of TOKENS, and whether the weights came from the cache."""
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    g = open_gguf(path)
    try:
        r = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=4, block_size=BLOCK,
                             threads=2, isa=isa, max_num_batched_tokens=16)
        n = len(TOKENS)
        batch = ScheduledBatch(seq_ids=[0], token_ids=TOKENS, positions=list(range(n)),
                               seq_starts=[0, n], context_lens=[n], block_tables=[[0]],
                               slot_mapping=list(range(n)), logits_indices=list(range(n)),
                               block_size=BLOCK)
        logits = r.execute(batch)
        hit = r.weights_from_cache
        r.close()
        return logits, hit
    finally:
        g.close()


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.lwc"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", weight_type=QT.Q4_1,
                            embd_type=QT.Q8_0, tied=False)


@pytest.mark.parametrize("isa", isas())
def test_cached_weights_give_the_fresh_logits(tiny, isa, monkeypatch, cache_dir):
    monkeypatch.setenv("LOCALINFER_WEIGHT_CACHE", "0")
    fresh, hit = run(tiny, isa)
    assert not hit and not cache_dir.exists()  # off: nothing written
    monkeypatch.delenv("LOCALINFER_WEIGHT_CACHE")
    first, hit1 = run(tiny, isa)
    second, hit2 = run(tiny, isa)
    assert (hit1, hit2) == (False, True)
    assert len(entries(cache_dir)) == 1
    np.testing.assert_array_equal(first, fresh)
    np.testing.assert_array_equal(second, fresh)


def test_generic_and_tiled_layouts_get_their_own_entries(tiny, cache_dir):
    run(tiny, "generic")
    run(tiny, isas()[-1])
    names = [p.name for p in entries(cache_dir)]
    assert any(".llama-stack." in n for n in names)
    if isas()[-1] != "generic":
        assert any(".llama-tiles." in n for n in names)
    assert run(tiny, "generic")[1]


@pytest.mark.parametrize("damage", ["truncate", "magic", "key", "garbage"])
def test_a_damaged_entry_is_rebuilt(tiny, cache_dir, damage):
    isa = isas()[-1]
    good, _ = run(tiny, isa)
    [entry] = entries(cache_dir)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "magic":
        entry.write_bytes(data[:-8] + b"XXXXXXXX")
    elif damage == "key":  # another file's entry under this name
        entry.write_bytes(data.replace(entry.name.split(".")[0].encode(), b"0" * 64))
    else:
        entry.write_bytes(b"\x07" * 100)
    logits, hit = run(tiny, isa)
    assert not hit
    np.testing.assert_array_equal(logits, good)
    assert run(tiny, isa)[1]  # rewritten whole


def test_a_changed_file_does_not_use_the_stale_entry(tmp_path, cache_dir):
    path = write_tiny_llama(tmp_path / "m.gguf", weight_type=QT.Q8_0, seed=1)
    isa = isas()[-1]
    old, _ = run(path, isa)
    assert run(path, isa)[1]
    [old_entry] = entries(cache_dir)
    write_tiny_llama(path, weight_type=QT.Q8_0, seed=2)  # same path and size, other content
    new, hit = run(path, isa)
    assert not hit
    assert not np.array_equal(new, old)
    assert not old_entry.exists()  # the old content's entry is dropped, not kept forever
    fresh, _ = run(write_tiny_llama(tmp_path / "copy.gguf", weight_type=QT.Q8_0, seed=2),
                   isa)
    np.testing.assert_array_equal(new, fresh)
    weight_cache.forget(path)  # what `localinfer rm` does before deleting the file
    assert entries(cache_dir) == []


def test_a_deleted_files_entry_goes_at_the_next_write(tmp_path, cache_dir):
    isa = isas()[-1]
    a = write_tiny_llama(tmp_path / "a.gguf", weight_type=QT.Q8_0, seed=3)
    run(a, isa)
    a.unlink()
    run(write_tiny_llama(tmp_path / "b.gguf", weight_type=QT.Q8_0, seed=4), isa)
    assert len(entries(cache_dir)) == 1
    assert len(list((cache_dir / "digests").glob("*.json"))) == 1


def test_gemma3_weights_round_trip(tmp_path, cache_dir):
    path = write_tiny_gemma3(tmp_path / "g.gguf")
    isa = isas()[-1]
    first, hit1 = run(path, isa)
    second, hit2 = run(path, isa)
    assert (hit1, hit2) == (False, True)
    np.testing.assert_array_equal(first, second)


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    """Writers racing on one entry: the survivor is one writer's complete tree, never a mix."""
    target, key = tmp_path / "e.lwc", {"k": 1}
    start = threading.Barrier(4)

    def write(i: int) -> None:
        tree = (i, np.full((256, 1024), i, np.int32), np.full(3000, i, np.uint8), None)
        start.wait()
        for _ in range(3):
            weight_cache.write_entry(target, key, tree)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    i, a, b, none = weight_cache.read_entry(target, key, {})
    assert none is None and (a == i).all() and (b == i).all() and a.flags.writeable
    assert [p.name for p in tmp_path.iterdir()] == ["e.lwc"]  # no temp files left


def test_real_model_maps_the_entry_and_not_the_gguf(smollm2_path, cache_dir):
    """SmolLM2: the cached load's logits are the fresh ones, and after loading (cache miss or
    hit) the GGUF's tensor pages are not resident in this process."""
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    isa = resolve_isa("auto")
    results = []
    for _ in range(2):
        g = open_gguf(smollm2_path)
        r = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=4, block_size=BLOCK,
                             threads=2, isa=isa, max_num_batched_tokens=16)
        n = len(TOKENS)
        batch = ScheduledBatch(seq_ids=[0], token_ids=TOKENS, positions=list(range(n)),
                               seq_starts=[0, n], context_lens=[n], block_tables=[[0]],
                               slot_mapping=list(range(n)), logits_indices=[n - 1],
                               block_size=BLOCK)
        # this GGUFFile's own mapping: other tests of the session may map the same file
        # (llama.cpp's reference model does), and their pages are theirs
        inside = g.raw(next(iter(g.tensors))).ctypes.data
        results.append((r.execute(batch), r.weights_from_cache,
                        resident_kb(smollm2_path, inside)))
        r.close()
        g.close()
    (fresh, hit1, rss1), (cached, hit2, rss2) = results
    assert (hit1, hit2) == (False, True)
    np.testing.assert_array_equal(cached, fresh)
    assert rss1 < 1024 and rss2 < 1024  # of a 98 MB file: header pages at most


def resident_kb(path: Path, address: int | None = None) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps); with `address`,
    of the one mapping that contains it."""
    total, inside = 0, False
    target = str(Path(path).resolve())
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(a, 16) for a in parts[0].split("-"))
                inside = (len(parts) > 5 and parts[5] == target
                          and (address is None or lo <= address < hi))
            elif inside and parts[0] == "Rss:":
                total += int(parts[1])
    return total


@pytest.mark.parametrize("ggml_type", sorted(FORMATS), ids=lambda t: FORMATS[t].name)
def test_formats_name_the_layout_their_unpack_returns(ggml_type):
    """LazyLayers.kind picks each role's layout from FORMATS before unpacking anything: the
    table must say what unpack really returns (else stack would narrow and fail)."""
    fmt = FORMATS[ggml_type]
    rows, cols = 4, 256
    raw = np.random.default_rng(ggml_type).integers(0, 256, rows * cols // fmt.block_size
                                                     * fmt.type_size, dtype=np.uint8)
    if fmt.block_size > 1:  # finite f16 fields are not needed: only the layout is checked
        raw[:] = 0
    p = unpack_tensor("t", ggml_type, fmt.name, raw, (cols, rows))
    assert p.kind == fmt.kind
    if p.kind in (KIND_Q4, KIND_Q5):
        assert p.zero == fmt.zero


@pytest.mark.parametrize("path_of", [lambda tiny, tmp: tiny,
                                     lambda tiny, tmp: write_tiny_gemma3(tmp / "g.gguf")],
                         ids=["llama", "gemma3"])
def test_step_weights_type_without_python(tiny, tmp_path, path_of, cache_dir):
    """Every weight tuple a step is given, fresh or from the cache, is one Numba's dispatcher
    fingerprints in C (tile_kind.with_markers): a TileKind object in it made Python type the
    whole tuple on every step (0.5 ms of a 5 ms decode)."""
    import dataclasses

    from localinfer.backends.numba_cpu.cached_weights import load_weights
    from numba._dispatcher import compute_fingerprint

    path = path_of(tiny, tmp_path)
    for _ in range(2):  # built, then mapped from the cache
        g = open_gguf(path)
        try:
            weights, _hit = load_weights(g, ModelConfig.from_gguf(g), tiled=True)
        finally:
            g.close()
        parts = [weights, *(getattr(weights, "base", None),)]
        stacks = [getattr(w, f.name) for w in parts if w is not None
                  for f in dataclasses.fields(w) if isinstance(getattr(w, f.name), tuple)]
        assert len(stacks) >= 6
        for s in stacks:
            compute_fingerprint(s)  # raises NotImplementedError for a Python-typed value
