"""create_app: the Starlette application (routes, middleware, error bodies, lifespan)."""

from __future__ import annotations

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

from localinfer.server import routes_generate, routes_infill, routes_info, routes_responses
from localinfer.server.config import ServerConfig
from localinfer.server.loading import start_loading
from localinfer.server.metrics import MetricsMiddleware, ServerMetrics
from localinfer.server.protocol import APIError
from localinfer.server.security import GuardMiddleware
from localinfer.server.state import ServerState

log = logging.getLogger("localinfer.server")


def model_id_for(config: ServerConfig) -> str:
    if config.served_model_name:
        return config.served_model_name
    if config.model is None:
        from localinfer.catalog import Catalog

        return Catalog.load().default
    if config.model.endswith(".gguf") or "/" in config.model:
        return Path(config.model).stem
    return config.model


def create_app(config: ServerConfig, *, model_path: Path | None = None,
               on_load_error: Callable[[], None] | None = None) -> Starlette:
    """The app; the model starts loading in the background when the app starts up."""
    state = ServerState(config=config, model_id=model_id_for(config), metrics=ServerMetrics(),
                        model_path=model_path)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        start_loading(state, on_load_error)
        yield
        state.draining = True
        if state.loop is not None:
            state.loop.shutdown(drain_timeout=0)  # connections are closed by now
        if state.llm is not None:
            state.llm.close()

    openai_routes = [
        ("/chat/completions", routes_generate.chat_completions, "POST"),
        ("/completions", routes_generate.completions, "POST"),
        ("/models", routes_info.models, "GET"),
        ("/responses", routes_responses.responses, "POST"),
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
    ]
    middleware = [Middleware(MetricsMiddleware, metrics=state.metrics)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.cors_origins,
                                     allow_methods=["GET", "POST", "OPTIONS"],
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
