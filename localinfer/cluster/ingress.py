"""Ingress: the Ray Serve deployment that answers HTTP — the single-process server's Starlette
app (create_app: the same routes, validation, security and error bodies) with a RemotePool,
so generation runs on the EngineReplica deployment.

The replica serves the app itself, under the same uvicorn server `localinfer serve` runs
(runner.DrainingServer, on a thread of its own) on --host/--port, rather than behind Serve's
HTTP proxy: the proxy would add a second actor hop to every request (measured: ~+15 ms on
2 cores). Serve still places, health-checks and restarts it (check_health fails once the HTTP
server has stopped); stopping it drains in-flight requests as SIGTERM does for `serve`.
It is pinned to the head node, whose address clients are given.

Two things differ from `localinfer serve`, both added around the app rather than inside it:
- responses name the replica that served them (replica_header.ReplicaHeader);
- GET /health also reports the engine replicas (Serve's view: how many run, of how many
  wanted) and answers 503 while none is running.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer.cluster.ingress_pool import RemotePool
from localinfer.cluster.replica_header import ReplicaHeader
from localinfer.server import routes_info
from localinfer.server.config import ServerConfig

log = logging.getLogger("localinfer.cluster")
APP_NAME = "localinfer"
ENGINE_DEPLOYMENT = "engine"
BIND_TIMEOUT_S = 30.0


def build_app(config: ServerConfig, engine: Any) -> Any:
    """create_app over the engine replicas, with the cluster's /health and replica header."""
    from localinfer.server.app import create_app

    app = create_app(config, pool_cls=RemotePool)
    app.state.server.pool.engine = engine
    app.router.routes.insert(0, Route("/health", cluster_health, methods=["GET"]))
    return app


class Ingress:
    def __init__(self, config: ServerConfig, engine: Any) -> None:
        import uvicorn

        from localinfer.server.runner import DrainingServer

        app = build_app(config, engine)
        uv_config = uvicorn.Config(ReplicaHeader(app), host=config.host, port=config.port,
                                   log_level=config.log_level, timeout_graceful_shutdown=5)
        self.server = DrainingServer(uv_config, app.state.server, config.drain_timeout)
        self.thread = threading.Thread(target=self.server.run, name="localinfer-http",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + BIND_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {config.host}:"
                                   f"{config.port} (port in use?)")
            time.sleep(0.05)

    def check_health(self) -> None:
        if not self.thread.is_alive():
            raise RuntimeError("the HTTP server has stopped")

    def __del__(self) -> None:
        """Serve stops the replica: drain, then stop the server (and the engines' leases)."""
        server = getattr(self, "server", None)
        if server is not None and self.thread.is_alive():
            server.begin_drain()
            self.thread.join(timeout=server.drain_timeout + 10)


async def cluster_health(request: Request) -> Response:
    """The server's /health, with the engine replicas' states; 503 while none runs."""
    answer = await routes_info.health(request)
    replicas = await asyncio.to_thread(engine_replicas)
    body = _json(answer)
    body["replicas"] = replicas
    status = answer.status_code
    if status == 200 and not replicas.get("RUNNING"):
        body["status"], status = "no replicas", 503
    return JSONResponse(body, status_code=status, headers=_retry_after(answer))


def engine_replicas() -> dict[str, int]:
    """Replica counts by state (RUNNING, STARTING, ...) as Serve's controller has them."""
    from ray import serve

    try:
        app = serve.status().applications[APP_NAME]
        states = app.deployments[ENGINE_DEPLOYMENT].replica_states
    except (KeyError, RuntimeError) as exc:  # not deployed (yet), or Serve is gone
        log.warning("no engine replica status: %s", exc)
        return {}
    return {str(getattr(state, "value", state)): int(n) for state, n in states.items()}


def _json(response: Response) -> dict[str, Any]:
    import json

    return dict(json.loads(bytes(response.body)))


def _retry_after(response: Response) -> dict[str, str]:
    value = response.headers.get("retry-after")
    return {"Retry-After": value} if value else {}
