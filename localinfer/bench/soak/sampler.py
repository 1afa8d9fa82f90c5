"""Read the server's /metrics and its resident memory every `interval` seconds.

A Sample keeps what the analysis needs: KV blocks used, sequences running and waiting, the
server's RSS (from /proc/PID/status when the server's pid is known, else None), the HTTP
status counts the server itself recorded and its abort-to-free histogram (cumulative buckets).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ABORT_METRIC = "localinfer_abort_to_free_seconds"


@dataclass(slots=True)
class Sample:
    t_s: float  # since the run began
    kv_used: float
    kv_total: float
    running: float
    waiting: float
    rss_bytes: int | None
    statuses: dict[str, float] = field(default_factory=dict)  # HTTP status -> count
    abort_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["abort_buckets"] = {str(k): v for k, v in self.abort_buckets.items()}
        return d


def parse_metrics(text: str, t_s: float, rss_bytes: int | None) -> Sample:
    values: dict[str, float] = {}
    statuses: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "localinfer_http_requests_total":
                if s.labels.get("route") not in ("/metrics", "/health"):
                    status = s.labels.get("status", "?")
                    statuses[status] = statuses.get(status, 0.0) + s.value
            elif s.name == ABORT_METRIC + "_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return Sample(t_s, values.get("localinfer_kv_blocks_used", math.nan),
                  values.get("localinfer_kv_blocks_total", math.nan),
                  values.get("localinfer_num_requests_running", math.nan),
                  values.get("localinfer_num_requests_waiting", math.nan),
                  rss_bytes, statuses, buckets)


def rss_of(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


async def scrape(client: httpx.AsyncClient, pid: int | None, t0: float) -> Sample | None:
    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return None  # a missed sample is a gap, not a failure of the run
    if r.status_code != 200:
        return None
    return parse_metrics(r.text, time.perf_counter() - t0, rss_of(pid))


class Sampler:
    """Scrapes until stopped; `samples` grows in time order."""

    def __init__(self, client: httpx.AsyncClient, pid: int | None, t0: float,
                 interval: float = 1.0) -> None:
        self.client, self.pid, self.t0, self.interval = client, pid, t0, interval
        self.samples: list[Sample] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Sampler:
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            sample = await scrape(self.client, self.pid, self.t0)
            if sample is not None:
                self.samples.append(sample)
            await asyncio.sleep(self.interval)
