"""run/chat sampling defaults: the GGUF's general.sampling.* keys, else llama.cpp's; flags win."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_factory import VT, write_tiny_llama

from localinfer.cli import main
from localinfer.errors import GGUFError
from localinfer.gguf_file import open_gguf
from localinfer.sampling_defaults import SamplingDefaults

RECOMMENDED = [
    ("general.sampling.temp", VT.FLOAT32, 0.6),
    ("general.sampling.top_k", VT.INT32, 20),
    ("general.sampling.top_p", VT.FLOAT32, 0.875),
    ("general.sampling.min_p", VT.FLOAT32, 0.0),  # a recorded zero is a choice, kept
    ("general.sampling.penalty_repeat", VT.FLOAT32, 1.125),
    ("general.sampling.penalty_last_n", VT.INT32, 32),
    ("general.sampling.mirostat", VT.INT32, 2),  # no such stage here: reported, not applied
]


def defaults_of(path: Path) -> SamplingDefaults:
    with open_gguf(path) as g:
        return SamplingDefaults.from_metadata(g.metadata)


@pytest.fixture(scope="module")
def recommending(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "rec.gguf", extra_kvs=RECOMMENDED)


def test_the_models_keys_give_its_settings(recommending: Path) -> None:
    d = defaults_of(recommending)
    p = d.params()
    assert (p.temperature, p.top_k, p.min_p, p.penalty_last_n) == (pytest.approx(0.6), 20, 0.0, 32)
    assert (p.top_p, p.repetition_penalty) == (0.875, 1.125)
    assert d.from_model == {"temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                            "penalty_last_n"}
    assert d.ignored == ("general.sampling.mirostat",)


def test_without_keys_llama_cpps_defaults(tmp_path: Path) -> None:
    d = defaults_of(write_tiny_llama(tmp_path / "plain.gguf"))
    p = d.params()
    # llama.cpp common/common.h, common_params_sampling
    assert (p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.penalty_last_n) == (
        40, pytest.approx(0.95), pytest.approx(0.05), 1.0, 64)
    assert p.temperature == pytest.approx(0.8) and not p.greedy
    assert d.from_model == frozenset() and d == SamplingDefaults.llama_cpp()


def test_flags_override_each_key_alone(recommending: Path) -> None:
    d = defaults_of(recommending)
    p = d.params(top_k=5, temperature=None, seed=7)
    assert (p.top_k, p.temperature, p.top_p, p.seed) == (5, pytest.approx(0.6), 0.875, 7)
    greedy = d.params(temperature=0.0)
    assert greedy.greedy and greedy.top_k == 20
    line = d.describe(p, {"top_k": 5})
    assert "top_k 5 (set)" in line and "temp 0.6 (model)" in line and "seed 7" in line
    assert "ignored: general.sampling.mirostat" in line
    assert d.describe(greedy, {"temperature": 0.0}).startswith("sampling: greedy")


@pytest.mark.parametrize(("key", "vtype", "value"), [
    ("general.sampling.top_p", VT.FLOAT32, 0.0), ("general.sampling.top_k", VT.STRING, "40"),
    ("general.sampling.temp", VT.FLOAT32, float("nan"))])
def test_a_bad_key_is_a_clear_error(tmp_path: Path, key: str, vtype: int, value: object) -> None:
    path = write_tiny_llama(tmp_path / "bad.gguf", extra_kvs=[(key, vtype, value)])
    with pytest.raises(GGUFError, match=r"top_p|general\.sampling"):
        defaults_of(path)


def test_run_stats_show_the_effective_settings(recommending: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp")  # llama.cpp's decoder: no kernel compile for this model
    argv = ["run", "--model", str(recommending), "--backend", "llamacpp", "--raw", "-n", "3",
            "--stats", "--min-p", "0.1", "--seed", "3", "hello"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "temp 0.6 (model)" in err and "min_p 0.1 (set)" in err and "seed 3" in err
    assert main(["run", "--model", str(recommending), "--top-p", "0", "hello"]) == 1
    assert "localinfer: error: invalid top_p" in capsys.readouterr().err


def run_text(model: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    argv = ["run", "--model", str(model), "-n", "24", *flags, "Tell me a story about a cat."]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_run_samples_by_default_and_greedy_on_request(smollm2_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2 carries no keys: llama.cpp's settings, so seeds matter; -t 0 does not vary."""
    a, b = (run_text(smollm2_path, capsys, "--seed", s) for s in ("1", "2"))
    assert a != b
    assert run_text(smollm2_path, capsys, "--seed", "1") == a  # a seed reproduces its run
    g1, g2 = (run_text(smollm2_path, capsys, "-t", "0", "--seed", s) for s in ("1", "2"))
    assert g1 == g2 and g1.strip()
