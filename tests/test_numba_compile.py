"""The first compile: displayed exactly once per model kind, and only what the model needs."""

from __future__ import annotations

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
