"""GET /openapi.json and `localinfer fuzz http`: the description covers every route the app
has, a few hundred schemathesis cases against a real loopback server (SmolLM2, generations of
at most 4 tokens) find no 5xx and no answer that breaks the description, and the failures
fuzzing found stay fixed."""

from __future__ import annotations

from pathlib import Path

import httpx
import jsonschema
import pytest

pytest.importorskip("schemathesis")

from server_harness import ServerThread  # noqa: E402

from localinfer.catalog import Catalog  # noqa: E402
from localinfer.cli import main  # noqa: E402
from localinfer.fuzz.http_fuzz import fuzz_http  # noqa: E402
from localinfer.server.config import ServerConfig  # noqa: E402
from localinfer.server.openapi import schemas  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server whose catalog has an empty model folder: /api/delete and /api/pull are fuzzed
    too, and must never touch the pulled models."""
    catalog = Catalog.load(models_dir=tmp_path_factory.mktemp("empty-models"))
    config = ServerConfig(model=str(smollm2_path), served_model_name="smollm2-fuzz",
                          max_model_len=256, threads=2)
    srv = ServerThread(config, smollm2_path, catalog=catalog).start()
    yield srv
    srv.stop()


def test_openapi_lists_every_route_and_method_the_app_answers(fuzz_server) -> None:
    document = httpx.get(f"{fuzz_server.url}/openapi.json").json()
    app = fuzz_server.server.config.app
    answered = {(route.path, m.lower()) for route in app.routes
                for m in route.methods - {"HEAD"}}
    described = {(path, m) for path, item in document["paths"].items() for m in item}
    assert described == answered
    for path in ("/v1/chat/completions", "/chat/completions", "/api/chat", "/v1/responses",
                 "/infill", "/tokenize", "/detokenize", "/metrics", "/api/ps", "/openapi.json"):
        assert path in document["paths"]
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["responses"]["400"]["content"]["application/json"]["schema"] == (
        schemas.OPENAI_ERROR)


def test_schemathesis_finds_no_server_error_and_no_schema_break(fuzz_server) -> None:
    report = fuzz_http(fuzz_server.url, max_examples=10, seconds=120)
    paths = httpx.get(f"{fuzz_server.url}/openapi.json").json()["paths"]
    assert report.operations == sum(len(item) for item in paths.values())  # every one
    assert len(report.by_operation) == report.operations
    # a GET without parameters has one case to make; every body-taking operation gets its share
    assert min(n for op, n in report.by_operation.items() if not op.startswith("GET")) >= 10
    assert report.cases >= 250
    assert report.server_errors == 0 and report.schema_failures == 0, report.failures
    assert report.transport_errors == 0, report.failures
    assert report.by_status.get(200, 0) > 10  # valid requests were answered, not only refused


def test_fuzz_http_command_against_a_url_skips_what_deletes_models(fuzz_server, capsys) -> None:
    rc = main(["fuzz", "http", "--url", fuzz_server.url, "--max-examples", "2",
               "--minutes", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "server errors (5xx): 0  responses breaking the schema: 0" in out
    assert "skipped (--all to include): DELETE /api/delete, POST /api/pull, POST /api/unload" in out


# -- what fuzzing found ----------------------------------------------------------------------


def test_keep_alive_of_centuries_means_forever_and_api_ps_still_answers(fuzz_server) -> None:
    """Found by schemathesis: keep_alive 1e300 made GET /api/ps answer 500 (OverflowError
    turning the expiry into a date)."""
    url = fuzz_server.url
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                   "keep_alive": 1e300}, timeout=120)
    assert r.status_code == 200, r.text
    ps = httpx.get(f"{url}/api/ps", timeout=30)
    assert ps.status_code == 200, ps.text
    jsonschema.validate(ps.json(), schemas.OLLAMA_MODELS)
    model = ps.json()["models"][0]
    assert model["expires_at"].startswith("2318") and model["localinfer"]["keep_alive_s"] is None
