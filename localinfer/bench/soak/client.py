"""Send one soak request and classify how it ended.

Outcomes: ok; rejected (429/503: the server shed load, Retry-After recorded); client_error
(another 4xx: expected for hostile bodies, a fault for normal ones); server_error (5xx);
stream_error (an error event inside a 200 stream, or a stream cut before `[DONE]`);
disconnected (we hung up on purpose); transport_error (the server dropped the connection);
timeout (no answer within the client timeout).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from localinfer.bench.soak.workload import RequestSpec
from localinfer.server.loadgen import StreamError, sse_events

SHED = (429, 503)


@dataclass(slots=True)
class Outcome:
    phase: str  # "soak" | "burst" | "baseline" | "overload"
    kind: str
    path: str
    stream: bool
    start_s: float  # since the run began
    outcome: str
    status: int = 0  # 0: no HTTP status (hung up, dropped)
    ttft_s: float | None = None  # streamed requests that produced text
    latency_s: float = 0.0
    retry_after: str | None = None  # the header of a 429/503, None when missing
    disconnect: str = ""
    hostile: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


async def send(client: httpx.AsyncClient, spec: RequestSpec, phase: str, t0: float) -> Outcome:
    start = time.perf_counter()
    out = Outcome(phase, spec.kind, spec.path, spec.stream, start - t0, "ok",
                  disconnect=spec.disconnect, hostile=spec.hostile)
    timed_hangup = spec.disconnect in ("early", "prefill", "read_timeout")
    try:
        work = _stream(client, spec, out, start) if spec.stream else _whole(client, spec, out)
        if timed_hangup:
            await asyncio.wait_for(work, spec.disconnect_after)
        else:
            await work
    except TimeoutError:  # our own hang-up: wait_for cancelled the request mid-flight
        out.outcome = "disconnected"
    except httpx.TimeoutException as exc:
        out.outcome, out.error = "timeout", _text(exc)
    except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
        out.outcome, out.error = "transport_error", _text(exc)
    out.latency_s = time.perf_counter() - start
    return out


async def _whole(client: httpx.AsyncClient, spec: RequestSpec, out: Outcome) -> None:
    r = await client.post(spec.path, content=spec.body, headers=_headers(spec))
    _status(out, r.status_code, r.headers, r.text)


async def _stream(client: httpx.AsyncClient, spec: RequestSpec, out: Outcome,
                  start: float) -> None:
    events = 0
    async with client.stream("POST", spec.path, content=spec.body,
                             headers=_headers(spec)) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode("utf-8", "replace")
            _status(out, r.status_code, r.headers, text)
            return
        out.status = 200
        try:
            async for event in sse_events(r):
                if "error" in event:
                    out.outcome, out.error = "stream_error", str(event["error"])[:200]
                    return
                if _has_text(event):
                    events += 1
                    if out.ttft_s is None:
                        out.ttft_s = time.perf_counter() - start
                    if spec.disconnect == "mid_stream" and events >= spec.disconnect_after:
                        out.outcome = "disconnected"
                        return  # leaving the block closes the connection mid-stream
        except StreamError as exc:
            out.outcome, out.error = "stream_error", str(exc)[:200]


def _status(out: Outcome, status: int, headers: httpx.Headers, text: str) -> None:
    out.status = status
    if status == 200:
        return
    if status in SHED:
        out.outcome, out.retry_after = "rejected", headers.get("retry-after")
    elif status >= 500:
        out.outcome = "server_error"
    else:
        out.outcome = "client_error"
    out.error = text[:200]


def _has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _headers(spec: RequestSpec) -> dict[str, str]:
    return {"content-type": "application/json", **spec.headers}


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
