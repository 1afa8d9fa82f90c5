"""ReplicaHeader: every generation response names the engine replica(s) that served it, in
`x-localinfer-replica` (comma-separated when a request's choices ran on several).

The routes do not know about replicas: this ASGI middleware gives each HTTP request a list that
RemoteLoop.submit appends its handles to, and holds the response's start message until each
handle's replica is known (its first output, or its end), so the header can go with it. A
stream therefore sends its headers with its first token.
"""

from __future__ import annotations

import asyncio
from typing import Any

from localinfer.cluster.remote_loop import SUBMITTED, RemoteHandle

HEADER = b"x-localinfer-replica"


class ReplicaHeader:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handles: list[RemoteHandle] = []
        token = SUBMITTED.set(handles)

        async def send_named(message: Any) -> None:
            if message["type"] == "http.response.start" and handles:
                names = await served_by(handles)
                if names:
                    headers = [*message.get("headers", []), (HEADER, ",".join(names).encode())]
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_named)
        finally:
            SUBMITTED.reset(token)


async def served_by(handles: list[RemoteHandle]) -> list[str]:
    """The distinct replicas of `handles`, in order, once each is known."""
    await asyncio.gather(*(asyncio.shield(h.replica) for h in handles))
    names: list[str] = []
    for h in handles:
        name = h.replica.result()
        if name is not None and name not in names:
            names.append(name)
    return names
