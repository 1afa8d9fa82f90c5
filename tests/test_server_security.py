"""RELIABILITY.md #20-#21: API key, loopback by default, CORS off, Host-header check."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("uvicorn")
from server_harness import ServerThread  # noqa: E402

from localinfer import cli  # noqa: E402
from localinfer.server.config import ServerConfig  # noqa: E402
from localinfer.server.security import allowed_host_names, host_name  # noqa: E402

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def guarded(smollm2_path):
    config = ServerConfig(model=str(smollm2_path), api_key=KEY, warmup=False,
                          allowed_hosts=["myhost.lan"], cors_origins=["https://app.example"])
    srv = ServerThread(config, smollm2_path).start(wait_ready=False)
    yield srv
    srv.stop()


def test_20_api_key_required(guarded) -> None:
    url = f"{guarded.url}/v1/models"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                    {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{guarded.url}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 401  # before any validation
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(f"{guarded.url}/metrics").status_code == 401


def test_20_health_stays_public(guarded) -> None:
    assert httpx.get(f"{guarded.url}/health").status_code in (200, 503)


def test_20_openai_client_with_key(guarded) -> None:
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert good.models.list().data
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_20_ollama_routes_need_the_key_too(guarded) -> None:
    ollama = pytest.importorskip("ollama")
    for path, body in (("/api/chat", {"model": "x", "messages": []}),
                       ("/api/generate", {"model": "x", "prompt": ""}),
                       ("/api/tags", None), ("/api/ps", None)):
        r = httpx.request("POST" if body is not None else "GET", f"{guarded.url}{path}",
                          json=body, headers={"Host": "localhost"})
        assert r.status_code == 401, path  # before the model is looked up or loaded
        evil = httpx.request("POST" if body is not None else "GET", f"{guarded.url}{path}",
                             json=body, headers={"Host": "evil.example",
                                                 "Authorization": f"Bearer {KEY}"})
        assert evil.status_code == 403, path
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=guarded.url).list()
    assert e.value.status_code == 401
    keyed = ollama.Client(host=guarded.url, headers={"Authorization": f"Bearer {KEY}"})
    assert keyed.list() is not None


def test_21_unexpected_host_header_is_403(guarded) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for host in ("evil.example", "evil.example:8000", "localhost.evil.example", ""):
        r = httpx.get(f"{guarded.url}/health", headers={"Host": host})
        assert r.status_code == 403, host
        assert r.json()["error"]["code"] == "invalid_host"
    for host in ("localhost", f"localhost:{guarded.port}", "127.0.0.1", "[::1]:80",
                 "myhost.lan", "MYHOST.LAN:1234"):
        r = httpx.get(f"{guarded.url}/v1/models", headers={"Host": host, **auth})
        assert r.status_code == 200, host


def test_21_cors_only_for_configured_origins(guarded) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(f"{guarded.url}/v1/chat/completions", headers=preflight)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    evil = {**preflight, "Origin": "https://evil.example"}
    r = httpx.options(f"{guarded.url}/v1/chat/completions", headers=evil)
    assert r.headers.get("access-control-allow-origin") != "https://evil.example"
    r = httpx.get(f"{guarded.url}/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_21_cors_off_by_default(server) -> None:
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = httpx.options(f"{server.url}/v1/chat/completions",
                      headers={"Origin": "https://evil.example",
                               "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers


def test_21_host_rules() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("Example.com:80") == "example.com"
    names = allowed_host_names(ServerConfig(host="10.0.0.5", allowed_hosts=["box.lan"]))
    assert {"localhost", "127.0.0.1", "::1", "10.0.0.5", "box.lan"} <= names
    assert "0.0.0.0" not in allowed_host_names(ServerConfig(host="0.0.0.0"))


def test_21_non_loopback_bind_needs_a_key_or_insecure(capsys) -> None:
    assert cli.main(["serve", "--host", "0.0.0.0", "--model", "/nonexistent.gguf"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error:") and "--api-key" in err
    # with --insecure it gets past the bind check and fails on the missing file instead
    assert cli.main(["serve", "--host", "0.0.0.0", "--insecure",
                     "--model", "/nonexistent.gguf"]) == 1
    assert "not found" in capsys.readouterr().err


def test_21_default_bind_is_loopback() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
