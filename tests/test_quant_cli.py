"""`localinfer quantize`: the command, bad inputs (one-line errors), crash safety (SIGKILL and a
full disk leave no partial target and no temp file)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf_factory import QT, build_gguf, tiny_llama_parts, write_tiny_llama
from localinfer.quant import gguf_writer
from test_cli import assert_clean_error, cli

from localinfer import cli as cli_main
from localinfer.gguf_file import open_gguf


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_ff=512)


def test_quantize_command_writes_a_model(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "tiny-q8.gguf"
    proc = cli("quantize", str(tiny), str(out), "--type", "q8_0", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "Q8_0" in proc.stderr and "MB/s" in proc.stderr
    with open_gguf(out) as g:
        assert g.metadata["general.file_type"] == 7
        assert g.tensors["blk.0.attn_q.weight"].type_name == "Q8_0"
        assert g.tensors["blk.0.attn_norm.weight"].type_name == "F32"
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_progress_bars_per_tensor(tiny: Path, tmp_path: Path, capsys) -> None:
    from localinfer.quant.quantizer import quantize_file

    quantize_file(tiny, tmp_path / "o.gguf", "Q4_0", progress=True)
    err = capsys.readouterr().err
    assert "blk.1.ffn_down.weight" in err and "F32 → Q4_0" in err and "100.0%" in err


def unsupported_arch(folder: Path) -> Path:
    kvs, tensors = tiny_llama_parts()
    kvs[0] = ("general.architecture", kvs[0][1], "mamba9")
    path = folder / "arch.gguf"
    path.write_bytes(build_gguf(kvs, tensors))
    return path


def missing_tensor(folder: Path) -> Path:
    kvs, tensors = tiny_llama_parts()
    path = folder / "missing.gguf"
    path.write_bytes(build_gguf(kvs, [t for t in tensors if t.name != "blk.1.ffn_up.weight"]))
    return path


def corrupt(folder: Path) -> Path:
    path = write_tiny_llama(folder / "corrupt.gguf")
    path.write_bytes(path.read_bytes()[:-5000])
    return path


@pytest.mark.parametrize("make, qtype, fragments", [
    (write_tiny_llama, "Q9_9", ("unknown quantization type", "Q4_K_M")),
    (write_tiny_llama, "Q2_K_S", ("importance matrix",)),
    (unsupported_arch, "Q8_0", ("architecture", "mamba9")),
    (missing_tensor, "Q8_0", ("missing tensor", "blk.1.ffn_up.weight")),
    (corrupt, "Q8_0", ("truncated",)),
])
def test_bad_input_gives_one_line_error(tmp_path: Path, make, qtype: str, fragments) -> None:
    src = make(tmp_path / "in.gguf") if make is write_tiny_llama else make(tmp_path)
    out = tmp_path / "out.gguf"
    assert_clean_error(cli("quantize", str(src), str(out), "--type", qtype), *fragments)
    assert not out.exists()
    assert not list(tmp_path.glob(".*.part"))


def test_missing_input_and_same_output(tmp_path: Path, tiny: Path) -> None:
    assert_clean_error(cli("quantize", str(tmp_path / "nope.gguf"), str(tmp_path / "o.gguf"),
                           "--type", "Q8_0"), "nope.gguf")
    assert_clean_error(cli("quantize", str(tiny), str(tiny), "--type", "Q8_0"), "differ")


def test_disk_full_leaves_old_target_and_no_temp(tiny: Path, tmp_path: Path, monkeypatch,
                                                 capsys) -> None:
    out = tmp_path / "model.gguf"
    out.write_bytes(b"the old complete file")
    real = gguf_writer.GGUFStreamWriter.write_tensor
    calls = {"n": 0}

    def write_tensor(self, *args, **kwargs):  # the disk fills up a few tensors in
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(gguf_writer.GGUFStreamWriter, "write_tensor", write_tensor)
    rc = cli_main.main(["quantize", str(tiny), str(out), "--type", "Q4_K_M", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert err[0].startswith(f"localinfer: error: [Errno 28] No space left on device writing {out} (")
    assert err[0].endswith("; the previous file, if any, is unchanged")
    assert out.read_bytes() == b"the old complete file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "tiny.gguf"]


def test_sigkill_mid_write_leaves_no_target(tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "big.gguf", n_layers=4, n_embd=1024, n_heads=8,
                           n_kv_heads=2, n_ff=4096, weight_type=QT.F16)
    out = tmp_path / "out" / "big-q2k.gguf"
    out.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "quantize", str(src), str(out),
                             "--type", "Q2_K", "--threads", "1", "--no-progress"],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    temps: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        temps = list(out.parent.glob(".*.part"))
        if temps and temps[0].stat().st_size > 1 << 20:  # well into the tensor data
            break
        time.sleep(0.02)
    assert proc.poll() is None, "quantize finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    # SIGKILL skips cleanup: the temp stays until a later run finds it stale and removes it
    for t in temps:
        os.utime(t, (time.time() - 3600, time.time() - 3600))
    done = cli("quantize", str(src), str(out), "--type", "Q8_0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.parent.iterdir()] == [out.name]
