"""`localinfer ps` and `localinfer stop NAME`: a running server's loaded models (GET /api/ps,
with localinfer's extra fields) and unloading one (POST /api/unload)."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from localinfer.errors import LocalInferError

DEFAULT_URL = "http://127.0.0.1:8000"


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "stop":
        p.add_argument("name", help="the model to unload (as the server names it)")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server (default: {DEFAULT_URL})")
    p.add_argument("--api-key", help="the server's API key, if it has one")


def main(name: str, args: argparse.Namespace) -> int:
    if name == "stop":
        answer = _call(args, "POST", "/api/unload", {"model": args.name})
        if answer.get("unloaded"):
            print(f"unloaded {args.name}" if not answer.get("pending")
                  else f"{args.name} unloads when its running requests finish")
        else:
            print(f"{args.name} is not loaded")
        return 0
    models = _call(args, "GET", "/api/ps")["models"]
    print(f"{'NAME':<28} {'MEMORY':>9} {'KV USE':>13} {'REQUESTS':>8}  UNTIL")
    for m in models:
        extra = m.get("localinfer", {})
        kv = f"{extra.get('kv_blocks_used', 0)}/{extra.get('kv_blocks_total', 0)} blk"
        print(f"{m['name']:<28} {m['size'] / 2**20:>6.0f} MB {kv:>13} "
              f"{extra.get('in_flight', 0):>8}  {_until(extra)}")
    if not models:
        print("(no model is loaded)")
    return 0


def _until(extra: dict[str, Any]) -> str:
    if extra.get("keep_alive_s") is None:
        return "forever"
    left = extra.get("expires_in_s")
    if left is None:
        return f"{extra['keep_alive_s']:g} s after its requests finish"
    return f"in {left:.0f} s"


def _call(args: argparse.Namespace, method: str, path: str,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(args.url.rstrip("/") + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if args.api_key:
        request.add_header("Authorization", f"Bearer {args.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", "")
        except ValueError:
            message = ""
        raise LocalInferError(f"{args.url}{path}: HTTP {exc.code} {message}".rstrip()) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LocalInferError(f"cannot reach the server at {args.url}: {reason}") from None
