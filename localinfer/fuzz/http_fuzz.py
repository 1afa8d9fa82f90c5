"""Fuzz a running server's HTTP API with schemathesis, from the server's own /openapi.json.

Every operation gets cases that fit its schema (positive) and cases that break it (negative),
`max_examples` of each, until the time bound. A case fails when the server answers 5xx
(`not_a_server_error`), a status the description does not list, a content type it does not
list, or a body that breaks the listed schema. Each distinct failure is kept once with a curl
line that reproduces it. `positive_data_acceptance` is not run: a valid-looking request may
still be refused for what only the loaded model knows (a prompt over its context, a token id
past its vocabulary), which the description lists as a 400.

Generating answers costs engine time, so positive cases are narrowed (`narrow`): every
generation sends a length of at most `MAX_GEN_TOKENS` tokens and at most 2 choices. Negative
cases are not narrowed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

# fields that set how many tokens a generation makes, and how many choices
_LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict",
                  "num_predict")
_CHOICE_FIELDS = ("n", "best_of")
MAX_GEN_TOKENS = 4
_MODEL_ROUTES = ("/api/unload", "/api/delete", "/api/pull")
REQUEST_TIMEOUT_S = 60.0
ROUND = 25  # examples per operation and mode before moving on to the next operation


@dataclass
class Failure:
    operation: str
    status: int | None
    checks: list[str]
    message: str
    curl: str


@dataclass
class HttpReport:
    operations: int = 0
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    by_operation: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0  # 5xx answers
    schema_failures: int = 0  # answers that break the description (status, type, body)
    transport_errors: int = 0  # no answer: a timeout or a dropped connection
    failures: list[Failure] = field(default_factory=list)  # distinct ones
    skipped: list[str] = field(default_factory=list)  # operations not fuzzed, and why
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.server_errors or self.schema_failures or self.transport_errors)


def narrow(document: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """Positive cases' cost profile: each generation-length field present in every request
    body that has one, between 1 and MAX_GEN_TOKENS; `n` and `best_of` at most 2. A body's
    `model` is one of `models` (the served ones; else nearly every case would end at a 404
    before the model's own checks) and `keep_alive` never unloads it (0 would make the next
    case load it again) — except on the routes that manage models (/api/unload, /api/delete,
    /api/pull), which keep their open names."""
    for path, item in document["paths"].items():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            schema = body["schema"]
            props = schema.get("properties", {})
            lengths = [name for name in _LENGTH_FIELDS if name in props]
            for name in lengths:
                props[name] = {"type": "integer", "minimum": 1, "maximum": MAX_GEN_TOKENS}
            for name in _CHOICE_FIELDS:
                if name in props:
                    props[name] = {**props[name], "maximum": 2}
            if "options" in props:  # Ollama's num_predict lives in options
                options = props["options"] = {**props["options"]}
                options["properties"] = {**options["properties"], "num_predict": {
                    "type": "integer", "minimum": 1, "maximum": MAX_GEN_TOKENS}}
                options["required"] = ["num_predict"]
            if "model" in props and models and path not in _MODEL_ROUTES:
                props["model"] = {"enum": models}
            if "keep_alive" in props:
                props["keep_alive"] = {"enum": [-1, "1h"]}
            if lengths:
                schema["required"] = sorted({*schema.get("required", []), lengths[0]})
    return document


def fuzz_http(base_url: str, *, max_examples: int, seconds: float,
              api_key: str | None = None, skip: Iterable[str] = (),
              on_case: Callable[[HttpReport], None] | None = None) -> HttpReport:
    """Fuzz every operation of the server at `base_url`, except `skip` ("METHOD /path")."""
    import hypothesis
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    document = httpx.get(f"{base_url}/openapi.json", headers=headers, timeout=30).json()
    served = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()
    models = [m["id"] for m in served.get("data", [])]
    schema = schemathesis.openapi.from_dict(narrow(document, models))
    # the curl lines must reproduce the case: schemathesis hides fields named like secrets
    # ("max_tokens" too); the API key is not in them (it rides on the session)
    schema.config.output.sanitization.enabled = False
    report = HttpReport()
    report.skipped = sorted(skip)
    seen: set[tuple[str, int | None, str]] = set()
    start = time.monotonic()
    end = start + seconds
    session = requests.Session()
    session.headers.update(headers)

    def settings(n: int) -> Any:
        return hypothesis.settings(
            max_examples=n, deadline=None, database=None, derandomize=False,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False)

    def run_case(label: str, case: Any) -> None:
        if time.monotonic() > end:
            return
        report.cases += 1
        report.by_operation[label] = report.by_operation.get(label, 0) + 1
        try:
            response = case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            report.transport_errors += 1
            _keep(report, seen, Failure(label, None, ["transport"], _first_line(exc),
                                        case.as_curl_command(base_url=base_url)))
            return
        status = response.status_code
        report.by_status[status] = report.by_status.get(status, 0) + 1
        if status >= 500:
            report.server_errors += 1
        try:
            case.validate_response(response, checks=checks)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a FailureGroup (a BaseExceptionGroup) of failed checks
            found = list(getattr(exc, "exceptions", [exc]))
            names = sorted({getattr(f, "code", "") + " " + type(f).__name__ for f in found})
            if status < 500:
                report.schema_failures += 1
            message = "; ".join(_first_line(f) for f in found)
            _keep(report, seen, Failure(label, status, names, message,
                                        case.as_curl_command(base_url=base_url)))
        if on_case is not None:
            on_case(report)

    operations = [(f"{op.method.upper()} {op.path}", op)
                  for op in (result.ok() for result in schema.get_all_operations())]
    operations = [(label, op) for label, op in operations if label not in report.skipped]
    report.operations = len(operations)
    # rounds of ROUND examples over every operation: a time bound cuts all of them short
    # alike, never the last ones to nothing
    for done in range(0, max_examples, ROUND):
        for label, operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if time.monotonic() > end:
                    break
                # Unsatisfiable: a mode with nothing to generate (negative cases of a bare GET)
                with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                    _run(settings(min(ROUND, max_examples - done)),
                         operation.as_strategy(generation_mode=mode),
                         lambda case, label=label: run_case(label, case))
    report.seconds = time.monotonic() - start
    return report


def _run(settings: Any, strategy: Any, body: Callable[[Any], None]) -> None:
    import hypothesis

    @settings
    @hypothesis.given(strategy)
    def test(case: Any) -> None:
        body(case)

    with hypothesis.reporting.with_reporter(lambda _: None):  # its seed hints: not failures
        test()


def _keep(report: HttpReport, seen: set[tuple[str, int | None, str]], failure: Failure) -> None:
    key = (failure.operation, failure.status, ",".join(failure.checks))
    if key not in seen:
        seen.add(key)
        report.failures.append(failure)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
