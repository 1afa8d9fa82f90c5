"""`localinfer fuzz gguf`: the seed corpus, a short fuzz run with each engine, and the failures
fuzzing found (each a regression test)."""

from __future__ import annotations

import json
import os
import resource
import struct
import time
from pathlib import Path

import pytest

from localinfer.cli import main
from localinfer.errors import GGUFError
from localinfer.fuzz.gguf_encode import VT, kv, string
from localinfer.fuzz.gguf_fuzz import fuzz_gguf
from localinfer.fuzz.gguf_seeds import write_corpus
from localinfer.fuzz.gguf_target import run_case
from localinfer.gguf_file import open_gguf
from localinfer.gguf_parse import MAX_ARRAY_ELEMENTS, MAX_HEADER_BYTES, MAX_STRING_BYTES


def test_corpus_real_seeds_load_and_every_hostile_class_is_refused(
        smollm2_path: Path, tmp_path: Path) -> None:
    seeds = write_corpus(tmp_path / "seeds", [smollm2_path])
    case = tmp_path / "case.gguf"
    outcomes = {p.name.rsplit("-", 1)[0]: run_case(p.read_bytes(), case) for p in seeds}
    assert outcomes.pop("0-real-" + smollm2_path.stem) is True  # the cut model loads
    classes = {name.split("-")[0] for name in outcomes}
    assert classes == {"1", "2", "3", "4", "5", "6", "7"}
    assert not any(outcomes.values()), [n for n, loads in outcomes.items() if loads]


@pytest.mark.parametrize("engine", ["atheris", "mutation"])
def test_short_fuzz_run_counts_cases_without_crash_or_hang(
        smollm2_path: Path, tmp_path: Path, engine: str) -> None:
    if engine == "atheris":
        pytest.importorskip("atheris")
    cases = 5000 if engine == "atheris" else 2000
    # as under the whole suite, where this process holds models: its memory past a GB must not
    # count as the fuzzer's (an in-process ru_maxrss, and a vfork+exec'd child's ru_maxrss,
    # both reported it; CI failed on the bounds below)
    ballast = bytearray(1200 << 20)
    before_mb = _rss_mb()
    report = fuzz_gguf(cases, 120, [smollm2_path], tmp_path / "work", engine)
    del ballast
    assert report.cases == cases
    assert report.crashes == 0 and report.hangs == 0, report.examples
    assert report.refused > report.loads > 0  # mutations mostly break it; some still load
    if engine == "atheris":  # the fuzzer child's own peak
        assert 0 < report.peak_rss_mb < 1024
    else:  # in this process: what the run added must stay bounded (the peak starts at the
        # resident size before the first case, so a run that adds nothing reports exactly it)
        assert before_mb <= report.peak_rss_mb < before_mb + 1024
    assert list((tmp_path / "work" / "findings").glob("crash-*")) == []


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def test_fuzz_gguf_command_prints_the_figures(smollm2_path: Path, capsys) -> None:
    rc = main(["fuzz", "gguf", "--cases", "300", "--minutes", "1", "--model",
               str(smollm2_path), "--engine", "mutation", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert figures["cases"] == 300 and figures["crashes"] == 0 and figures["hangs"] == 0


# -- what fuzzing found ----------------------------------------------------------------------


def _sparse_gguf(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_string_of_gigabytes_inside_a_sparse_file_is_refused_fast(tmp_path: Path) -> None:
    """Found by atheris: a metadata string whose 4 GiB length fits in a 16 GiB (sparse) file
    passed every bounds check and was copied: 8 GB of RSS and 25 s."""
    huge = 4 << 30
    head = (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("general.architecture", VT.STRING, "x")
            + string("general.name") + struct.pack("<IQ", VT.STRING, huge))
    path = _sparse_gguf(tmp_path / "huge.gguf", head, len(head) + huge + 64)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(GGUFError, match=f"more than the limit of {MAX_STRING_BYTES}"):
        open_gguf(path)
    assert time.perf_counter() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100 << 10  # KB


def test_header_past_its_limit_is_refused(tmp_path: Path) -> None:
    """Found by atheris: 64 MiB of string values (each within its own limit) took over 1 s to
    copy and decode on the busy machine; the header must end within MAX_HEADER_BYTES."""
    n = MAX_HEADER_BYTES // MAX_STRING_BYTES + 2
    path = tmp_path / "long-header.gguf"
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n))
        for i in range(n):
            f.write(string(f"general.s{i}") + struct.pack("<IQ", VT.STRING, MAX_STRING_BYTES))
            f.write(b"a" * MAX_STRING_BYTES)
    start = time.perf_counter()
    with pytest.raises(GGUFError, match=f"first {MAX_HEADER_BYTES >> 20} MiB"):
        open_gguf(path)
    assert time.perf_counter() - start < 1.0


def test_array_longer_than_any_vocabulary_is_refused(tmp_path: Path) -> None:
    n = MAX_ARRAY_ELEMENTS + 1
    head = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("tokenizer.ggml.scores")
            + struct.pack("<IIQ", VT.ARRAY, VT.UINT8, n))
    path = _sparse_gguf(tmp_path / "long.gguf", head, len(head) + n)
    with pytest.raises(GGUFError, match=f"more than the limit of {MAX_ARRAY_ELEMENTS}"):
        open_gguf(path)


def test_a_hang_must_be_slow_twice_a_stall_once(tmp_path: Path) -> None:
    """A shared machine can stall any case past 1 s; an input hangs only if its rerun does."""
    from localinfer.fuzz.gguf_atheris import HANG_S, Tally

    tally = Tally(tmp_path / "stats.json", tmp_path)
    tally.case(b"stalled", "refused", HANG_S + 0.5, "", retime=lambda: 0.01)
    tally.case(b"hangs", "refused", HANG_S + 0.5, "", retime=lambda: HANG_S + 0.2)
    figures = json.loads((tmp_path / "stats.json").read_text())
    assert (figures["cases"], figures["hangs"], figures["stalls"]) == (2, 1, 1)
    assert figures["slowest_s"] == pytest.approx(HANG_S + 0.2)
    assert [e["kind"] for e in figures["examples"]] == ["hang"]
    assert len(list(tmp_path.glob("hang-*"))) == 1
