"""create_app: the Starlette application (routes, middleware, error bodies, lifespan)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer.catalog import Catalog
from localinfer.server import routes_generate, routes_infill, routes_info
from localinfer.server.config import ServerConfig, model_args
from localinfer.server.loading import preload
from localinfer.server.metrics import MetricsMiddleware, ServerMetrics
from localinfer.server.models import routes_loaded
from localinfer.server.models.keep_alive import DEFAULT_KEEP_ALIVE, FOREVER, parse_keep_alive
from localinfer.server.models.memory_plan import MemoryPlan, default_budget
from localinfer.server.models.pool import ModelPool
from localinfer.server.models.served import ServedModels
from localinfer.server.ollama import routes_generate as ollama_generate
from localinfer.server.ollama import routes_models as ollama_models
from localinfer.server.openapi.document import openapi_route
from localinfer.server.protocol import APIError
from localinfer.server.responses import routes as responses_routes
from localinfer.server.security import GuardMiddleware
from localinfer.server.state import ServerState

log = logging.getLogger("localinfer.server")


def build_state(config: ServerConfig, *, model_path: Path | None = None,
                catalog: Catalog | None = None, pool_cls: type[ModelPool] = ModelPool
                ) -> ServerState:
    """The served models, their memory plan and pool. `model_path`: the first model's file,
    already resolved (serve pulls a named catalog model before the socket opens); `pool_cls`:
    where engines run (a cluster's ingress passes one whose engines are remote)."""
    names = model_args(config)
    paths = {names[0]: model_path} if names and model_path is not None else {}
    served = ServedModels(catalog or Catalog.load(), names, config.served_model_name,
                          config.allow_pull, paths)
    plan = MemoryPlan(config.max_memory or default_budget())
    if config.keep_alive is not None:
        keep_alive = parse_keep_alive(config.keep_alive)
    else:  # one named model stays loaded, as a one-model server always kept it
        keep_alive = FOREVER if len(names) == 1 else DEFAULT_KEEP_ALIVE
    pool = pool_cls(config, served, plan, keep_alive)
    metrics = ServerMetrics()
    pool.on_abort_freed = metrics.abort_to_free.observe
    return ServerState(config=config, served=served, pool=pool, metrics=metrics)


def create_app(config: ServerConfig, *, model_path: Path | None = None,
               on_load_error: Callable[[], None] | None = None,
               catalog: Catalog | None = None, pool_cls: type[ModelPool] = ModelPool
               ) -> Starlette:
    """The app; the default model starts loading in the background when the app starts up."""
    state = build_state(config, model_path=model_path, catalog=catalog, pool_cls=pool_cls)
    state.metrics.watch_engines(state.pool.engine_snapshots, state.pool.snapshot_labels)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.pool.start()
        preloading = asyncio.ensure_future(preload(state, on_load_error))
        yield
        state.draining = True
        preloading.cancel()
        state.pool.close()  # connections are closed by now

    openai_routes = [
        ("/chat/completions", routes_generate.chat_completions, "POST"),
        ("/completions", routes_generate.completions, "POST"),
        ("/models", routes_info.models, "GET"),
        ("/responses", responses_routes.responses, "POST"),
    ]
    # each OpenAI route also without /v1, as llama-server answers them: for clients given
    # a bare base URL (http://host:port)
    routes = [Route(prefix + path, handler, methods=[method])
              for path, handler, method in openai_routes for prefix in ("/v1", "")]
    routes += [
        Route("/infill", routes_infill.infill, methods=["POST"]),
        Route("/health", routes_info.health, methods=["GET"]),
        Route("/metrics", routes_info.metrics, methods=["GET"]),
        Route("/tokenize", routes_info.tokenize, methods=["POST"]),
        Route("/detokenize", routes_info.detokenize, methods=["POST"]),
        *ollama_models.ROUTES,
        *ollama_generate.ROUTES,
        *routes_loaded.ROUTES,
    ]
    routes.append(openapi_route(routes))
    middleware = [Middleware(MetricsMiddleware, metrics=state.metrics)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.cors_origins,
                                     allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                                     allow_headers=["Authorization", "Content-Type"]))
    middleware.append(Middleware(GuardMiddleware, config=config))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                        Exception: _server_error})
    app.state.server = state
    return app


async def _api_error(request: Request, exc: Any) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Any) -> Response:
    error = APIError(exc.status_code, str(exc.detail),
                     code="not_found" if exc.status_code == 404 else None)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s", request.url.path, exc_info=exc)
    error = APIError(500, f"internal server error: {type(exc).__name__}", type="server_error")
    return JSONResponse(error.body(), status_code=500)
