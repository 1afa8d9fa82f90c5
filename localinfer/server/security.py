"""Safe defaults: Host-header check (DNS rebinding), API key, request body limit.

A pure ASGI middleware (not BaseHTTPMiddleware, which would break streaming and disconnect
detection). Order of checks: Host → API key → declared body size. `/health` needs no key.

An oversized body is answered 413 and then read to its end and dropped (at most DRAIN_BYTES,
stopping when the client pauses DRAIN_IDLE_S): closing a socket with unread bytes makes the
kernel reset the connection, and a client still sending its body then sees a connection error
instead of the 413 — which the openai client retries, the load it was refused coming back.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from typing import Any

from starlette.requests import Request

from localinfer.server.config import LOOPBACK_NAMES, ServerConfig
from localinfer.server.protocol import APIError, parse_json_object

PUBLIC_PATHS = frozenset({"/health"})
DRAIN_BYTES = 64 << 20
DRAIN_IDLE_S = 1.0
DRAIN_TOTAL_S = 10.0
_WILDCARD_BINDS = ("0.0.0.0", "::", "")


def allowed_host_names(config: ServerConfig) -> frozenset[str]:
    names = {*LOOPBACK_NAMES, *(h.lower() for h in config.allowed_hosts)}
    if config.host not in _WILDCARD_BINDS:
        names.add(config.host.lower())
    return frozenset(names)


def host_name(header: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class GuardMiddleware:
    def __init__(self, app: Any, config: ServerConfig) -> None:
        self.app = app
        self.config = config
        self.hosts = allowed_host_names(config)
        self.any_host = "*" in self.hosts
        # an IP literal cannot be rebound by DNS; on a wildcard bind accept any of them
        self.ip_hosts = config.host in _WILDCARD_BINDS
        self.key = config.api_key.encode() if config.api_key else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        error = self._check(scope, headers)
        if error is not None:
            await send_error(send, error, receive if error.status == 413 else None)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Any, headers: dict[str, str]) -> APIError | None:
        if not self.any_host:
            name = host_name(headers.get("host", ""))
            if name not in self.hosts and not (self.ip_hosts and _is_ip_literal(name)):
                return APIError(403, f"Host header {name!r} is not allowed (add it with "
                                "--allowed-host)", code="invalid_host")
        if self.key is not None and scope.get("path") not in PUBLIC_PATHS:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            given = token.strip().encode() if scheme.lower() == "bearer" else b""
            if not hmac.compare_digest(given, self.key):
                return APIError(401, "missing or incorrect API key (send 'Authorization: "
                                "Bearer KEY')", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return APIError(400, "invalid Content-Length header")
            if int(length) > self.config.max_body_bytes:
                return too_large(self.config.max_body_bytes)
        return None


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than the limit of {limit} bytes",
                    code="request_too_large",
                    headers={"Connection": "close"})  # drained (bounded), then closed


async def send_error(send: Any, error: APIError, drain_from: Any = None) -> None:
    """The error response; with `drain_from` (the request's receive), the unread request body
    is drained after the answer is written and before the response (and the connection) ends,
    so the client can read the answer whatever it was still sending."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": drain_from is not None})
    if drain_from is not None:
        await drain(drain_from)
        await send({"type": "http.response.body", "body": b""})


async def drain(receive: Any) -> None:
    """Read and drop the rest of a request body (see the module's policy for the bounds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + DRAIN_TOTAL_S
    size = 0
    while size < DRAIN_BYTES:
        timeout = min(DRAIN_IDLE_S, end - loop.time())
        if timeout <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), timeout)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object; 413 as soon as it grows past `limit` (a chunked
    body has no Content-Length to check up front), 415 for a non-JSON content type."""
    ctype = request.headers.get("content-type")
    if ctype is not None and ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"unsupported content type {ctype!r}; send application/json")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            await drain(request.receive)
            raise too_large(limit)
        chunks.append(chunk)
    return parse_json_object(b"".join(chunks))
