"""Shared fixtures: the real SmolLM2 GGUF (pulled once into the cache) and a llama.cpp reference."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest

# The Triton backend's tests: without an NVIDIA GPU its kernels run under Triton's interpreter,
# which must be chosen before any @triton.jit kernel is defined — so here, before any test
# module is imported (tests/triton_env.py says which device the tests then use)
if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The emulated NEON checks (tests/arm64_emulated.py) run in the background of the session at
# idle priority: their tests go last, so the checks get all the idle time before them.
NEON_TESTS = "test_neon_kernels.py"


@pytest.hookimpl(trylast=True)  # after -k / --deselect have chosen
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == NEON_TESTS)  # stable: the rest keep order


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(
            item.path.name == NEON_TESTS and "results" in getattr(item, "fixturenames", ())
            for item in session.items):
        return
    import arm64_emulated

    if not arm64_emulated.NATIVE and arm64_emulated.LAUNCHER.exists():
        arm64_emulated.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "arm64_emulated" in sys.modules:  # an interrupted or failed session: no orphans
        sys.modules["arm64_emulated"].stop()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _catalog_model("LOCALINFER_TEST_MODEL", "smollm2-135m")


@pytest.fixture(scope="session")
def llama_ref(smollm2_path: Path):
    """llama-cpp-python on the same file: the parity reference (logits for every position)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(
        model_path=str(smollm2_path),
        n_ctx=2048,
        n_batch=512,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )


def _catalog_model(env: str, name: str) -> Path:
    path = os.environ.get(env)
    if path:
        return Path(path)
    from localinfer.catalog import Catalog

    return Catalog.load().ensure(name, progress=False)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _catalog_model("LOCALINFER_TEST_GEMMA3", "gemma3-270m")


@pytest.fixture(scope="session")
def qwen2_path() -> Path:
    return _catalog_model("LOCALINFER_TEST_QWEN2", "qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen2_15b_path() -> Path:
    return _catalog_model("LOCALINFER_TEST_QWEN2_15B", "qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def server(smollm2_path: Path):
    """One real localinfer server (uvicorn, loopback, a free port) shared by the server tests;
    a 512-token context keeps the long-prompt cases quick."""
    pytest.importorskip("uvicorn")
    from server_harness import ServerThread

    from localinfer.server.config import ServerConfig

    config = ServerConfig(model=str(smollm2_path), served_model_name="smollm2-test",
                          max_model_len=512, max_num_seqs=16, threads=2)
    srv = ServerThread(config, smollm2_path).start()
    yield srv
    srv.stop()
