"""The first compile: displayed exactly once per model kind, and only what the model needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from localinfer.backends.numba_cpu.compile_notice import CompileNotice
from localinfer.backends.numba_cpu.weights import q8k_roles


def test_notice_once_then_silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))  # the compile-time record
    first = CompileNotice("llama", "avx2", "Q4_0", enabled=True)
    assert first.pending
    with pytest.raises(RuntimeError), first:  # a failed step does not count as compiled
        raise RuntimeError("boom")
    assert first.pending and not (tmp_path / "compiled").exists()
    with first:
        pass
    err = capsys.readouterr().err  # not a terminal: plain lines, no carriage returns
    assert err.count("compiling the kernels for this CPU (once;") == 2 and "stopped" in err
    assert "kernels compiled in" in err and "\r" not in err
    assert not CompileNotice("llama", "avx2", "Q4_0", enabled=True).pending
    assert CompileNotice("llama", "avx2", "Q4_K", enabled=True).pending  # another kind
    with CompileNotice("llama", "avx2", "Q4_0", enabled=True):
        pass
    assert capsys.readouterr().err == ""


def _model(role_type: str, head_type: str = "Q8_0", n_layers: int = 2):
    names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    tensors = {f"blk.{i}.{n}.weight": SimpleNamespace(type_name=role_type)
               for i in range(n_layers) for n in names}
    tensors["token_embd.weight"] = SimpleNamespace(type_name=head_type)
    return (SimpleNamespace(tensors=tensors),
            SimpleNamespace(n_layers=n_layers, tied_embeddings=True))


@pytest.mark.parametrize(("role_type", "head_type", "k_quants"), [
    ("Q4_0", "Q8_0", False), ("Q4_1", "Q6_K", True), ("Q4_K", "Q8_0", True)])
def test_q8k_path_only_for_k_quants(role_type: str, head_type: str, k_quants: bool) -> None:
    """Without K-quants the flags are None: the step is typed without the q8_K path, so a
    first run does not compile it (project_q8k.project_as)."""
    flags = q8k_roles(*_model(role_type, head_type))
    assert (flags is not None) == k_quants
    if flags is not None:
        assert flags[:4].all() == (role_type == "Q4_K")
        assert flags[4, 0] == (head_type == "Q6_K")


def test_a_tiled_projection_compiles_only_its_own_kind() -> None:
    """A TileStack's kind is in its Numba type (tile_kind.py): projecting a 4-bit role
    compiles matmul_tiles for 4-bit tiles only, and no float32 matmul — the 5- and 8-bit loops
    wait for a model that has such roles.  (A fresh process: signatures accumulate.)"""
    code = textwrap.dedent("""
        import numpy as np
        from gguf import GGMLQuantizationType as QT, quants
        from numba import njit
        from localinfer.backends.numba_cpu.dispatch import project
        from localinfer.backends.numba_cpu.isa import Isa
        from localinfer.backends.numba_cpu.kernels.matmul import matmul_f32
        from localinfer.backends.numba_cpu.kernels.matmul_tiles import matmul_tiles
        from localinfer.backends.numba_cpu.llama import make_buffers
        from localinfer.backends.numba_cpu.quants import unpack_tensor
        from localinfer.backends.numba_cpu.weights import stack_tiles

        @njit
        def run(isa, ws, x, qbuf, out):
            project(isa, ws, 0, x, qbuf, out)

        w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
        raw = quants.quantize(w, QT.Q4_0).reshape(-1)
        ws = stack_tiles([unpack_tensor("w", int(QT.Q4_0), "Q4_0", raw, (64, 32))])
        x = np.ones((2, 64), np.float32)
        run(Isa("avx2"), ws, x, make_buffers(2, 64, 1, 1, 64, 64, 2)[-1],
            np.zeros((2, 32), np.float32))
        print(sorted(str(sig[1]) for sig in matmul_tiles.signatures), len(matmul_f32.signatures))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['TileKind(4)']", "0"]
