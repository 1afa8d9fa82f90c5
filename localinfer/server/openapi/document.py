"""The OpenAPI 3.1 description of the app's routes, served at GET /openapi.json.

It is built from the app's own route table: every (path, method) the app answers must have an
operation in operations.OPERATIONS (an OpenAI route may be looked up by its bare path), or the
app does not start; so the description never lists a route the server lacks nor misses one it
has.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer import __version__
from localinfer.server.openapi.operations import OPERATIONS, Operation

PATH = "/openapi.json"
_IGNORED_METHODS = frozenset({"HEAD", "OPTIONS"})  # Starlette adds HEAD to every GET


def operation_for(path: str, method: str) -> Operation:
    key = (path, method)
    if key not in OPERATIONS and path.startswith("/v1/"):
        key = (path[len("/v1"):], method)
    if key not in OPERATIONS:
        raise LookupError(f"no OpenAPI operation describes {method} {path}")
    return OPERATIONS[key]


def build_document(routes: Iterable[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        for method in sorted((route.methods or set()) - _IGNORED_METHODS):
            op = dict(operation_for(route.path, method))
            op["operationId"] = f"{method.lower()}{route.path.replace('/', '_').replace('.', '_')}"
            paths.setdefault(route.path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "localinfer", "version": __version__,
                 "description": "OpenAI-, llama.cpp- and Ollama-compatible local inference."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


def openapi_route(routes: list[Route]) -> Route:
    """GET /openapi.json describing `routes` and itself; built once, when the app is made."""
    document: dict[str, Any] = {}

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    route = Route(PATH, openapi, methods=["GET"])
    document.update(build_document([*routes, route]))
    return route
