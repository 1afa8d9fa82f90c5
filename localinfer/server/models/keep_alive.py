"""keep_alive durations, as Ollama reads them: how long a model stays loaded once idle.

A number is seconds; a string is a Go duration ("5m", "30s", "1h30m", "500ms") or a plain
number of seconds; 0 unloads the model as soon as its last request finishes; a negative value
keeps it loaded until the server stops (returned here as None: no expiry), and so does one
longer than LONGEST (a century: infinity, 1e300 s), which no clock or timer could represent.
"""

from __future__ import annotations

import math
import re
from typing import Any

from localinfer.errors import InvalidRequestError

DEFAULT_KEEP_ALIVE = 300.0  # seconds (Ollama's default)
FOREVER = None
LONGEST = 100 * 365 * 86400.0
_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float | None:
    """Seconds the model stays loaded once idle; None for forever. InvalidRequestError for
    anything that is not a duration."""
    if isinstance(value, bool):
        raise _invalid(value)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_string(value.strip())
    else:
        raise _invalid(value)
    if math.isnan(seconds):
        raise _invalid(value)
    return FOREVER if seconds < 0 or seconds > LONGEST else seconds


def _parse_string(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    if not body or _PART.sub("", body):
        raise _invalid(text)
    return sign * sum(float(n) * _SECONDS[unit] for n, unit in _PART.findall(body))


def _invalid(value: Any) -> InvalidRequestError:
    return InvalidRequestError(
        f"invalid keep_alive {value!r}: seconds, or a duration such as '5m', '30s', '1h', "
        "'0' (unload when idle) or '-1' (keep loaded)")


def describe(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    return f"{seconds:g} s"
