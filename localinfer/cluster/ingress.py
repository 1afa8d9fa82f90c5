"""Ingress: the Ray Serve deployment that answers HTTP — the single-process server's Starlette
app (create_app: the same routes, validation, security and error bodies), built in the replica
with a RemotePool, so generation runs on the EngineReplica deployment.

Two things differ from `localinfer serve`, both added around the app rather than inside it:
- responses name the replica that served them (replica_header.ReplicaHeader);
- GET /health also reports the engine replicas (Serve's view: how many run, of how many
  wanted) and answers 503 while none is running.
"""

from __future__ import annotations

import asyncio
import logging
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


class Ingress:
    def __init__(self, config: ServerConfig, engine: Any) -> None:
        self.config = config
        self.engine = engine  # DeploymentHandle to EngineReplica

    def __serve_build_asgi_app__(self) -> Any:
        from localinfer.server.app import create_app

        app = create_app(self.config, pool_cls=RemotePool)
        app.state.server.pool.engine = self.engine
        app.router.routes.insert(0, Route("/health", cluster_health, methods=["GET"]))
        return ReplicaHeader(app)


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
