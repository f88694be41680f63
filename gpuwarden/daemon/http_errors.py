"""Every failure as one JSON line: the error body, the status for each error code, the words for
each way a request can be malformed, and the `Allow` of a resource.

Messages quote what the client sent; a value longer than `VALUE_MAX` characters is cut, so a
hostile request cannot make the daemon echo megabytes back (or into its log).
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuwarden.core.api import ErrorBody, ErrorDetail
from gpuwarden.core.errors import ConfigError, UserError, one_line
from gpuwarden.daemon.storage_health import storage_message

log = logging.getLogger("gpuwarden.daemon.http")

# A spec (at most 1 MB as YAML) and the submitter's environment (at most 2 MiB) with JSON's escapes.
MAX_BODY_BYTES = 4 << 20
VALUE_MAX = 120
MESSAGE_MAX = 2000
STATUS_BY_CODE = {
    "not_found": 404,
    "conflict": 409,
    "already_running": 409,
    "ambiguous": 409,  # a valid reference that several runs answer to now: the state decides
    "invalid_config": 422,
    "invalid_request": 422,
    "key_reused": 422,
    "deadline": 503,
}
_LONG_VALUE = re.compile(rf"\S{{{VALUE_MAX + 1},}}")
_PARSE_FAILED = "There was an error parsing the body"
# On a refused body: the daemon reads no more of it (uvicorn would read the rest and drop it).
CLOSE = {"Connection": "close"}


def too_large_message(limit: int = MAX_BODY_BYTES) -> str:
    size = f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit / 1024:g} KiB"
    return f"the request body is larger than {size}, the most the API reads: send a smaller spec"


def cut(text: str) -> str:
    """`text` with every value longer than VALUE_MAX characters cut to its start, and the whole
    kept under MESSAGE_MAX."""
    short = _LONG_VALUE.sub(lambda m: f"{m.group()[: VALUE_MAX - 20]}…({len(m.group())} characters)", text)
    return short if len(short) <= MESSAGE_MAX else short[: MESSAGE_MAX - 1] + "…"


def error_response(
    status: int,
    code: str,
    message: str,
    problems: list[str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    detail = ErrorDetail(
        code=code,
        message=cut(one_line(message)),
        problems=None if problems is None else [cut(one_line(p)) for p in problems],
    )
    return JSONResponse(
        ErrorBody(error=detail).model_dump(exclude_none=True), status_code=status, headers=headers
    )


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    content_type = request.headers.get("content-type", "")
    if request.method in ("POST", "PATCH") and content_type and "json" not in content_type:
        # FastAPI reads a body of another type as text: its error would blame the JSON inside.
        message = f"request: the body was sent as {content_type.split(';')[0]}: send it as JSON with "
        return error_response(415, "unsupported_media_type", message + "Content-Type: application/json")
    return error_response(422, "invalid_request", validation_message(exc))


async def user_error(request: Request, exc: UserError) -> JSONResponse:
    problems = exc.problems if isinstance(exc, ConfigError) else None
    return error_response(STATUS_BY_CODE.get(exc.code, 400), exc.code, str(exc), problems)


async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 405:
        return _method_not_allowed(request)
    if exc.status_code == 413:
        return error_response(413, "too_large", too_large_message(), headers=CLOSE)
    if exc.status_code == 400 and exc.detail == _PARSE_FAILED:
        return error_response(400, "bad_input", unreadable_body(exc.__cause__))
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no such resource: {request.url.path} (the operations are listed in /v1/openapi.json)"
        return error_response(404, "not_found", message)
    code = {404: "not_found"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def storage_error(request: Request, exc: Exception) -> JSONResponse:
    """An OSError or SQLite error: a full or unwritable disk is the machine's problem, answered
    and logged in one line (and reported by /v1/health until it is over); anything else is a bug.
    (Registered for these types: the handler for `Exception` runs in Starlette's outermost
    middleware, which logs a traceback regardless.)"""
    health = request.app.state.daemon.storage
    fault = health.fault_of(exc)
    if fault is None:
        return await bug(request, exc)
    health.failed(fault, database=isinstance(exc, sqlite3.Error))  # it logs the fault, once a while
    log.debug("%s %s: cannot write %s", request.method, request.url.path, fault.problem)
    return error_response(507, fault.code, storage_message(fault))


async def bug(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, "internal", f"daemon error: {type(exc).__name__}: {exc}")


def unreadable_body(cause: BaseException | None) -> str:
    """What is wrong with a body the JSON parser refused, in words."""
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not UTF-8 text: send a JSON object (see /v1/openapi.json)"
    if isinstance(cause, RecursionError):
        return "the body nests arrays or objects too deeply: a run spec needs only a few levels"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        # CPython refuses integers of more than 4300 digits (a denial-of-service guard).
        return "the body holds a number with more than 4300 digits: send numbers of a sensible size"
    return "the body is not valid JSON: send a JSON object (see /v1/openapi.json)"


def validation_message(exc: RequestValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        msg = str(err.get("msg", "invalid")).replace("Value error, ", "")
        if loc == "request" and err.get("type") in ("model_attributes_type", "dict_type"):
            msg = "the body must be a JSON object (the fields are in /v1/openapi.json)"
        elif err.get("type") == "json_invalid":
            # pydantic puts the character offset in the location: say it in words instead.
            at = err.get("loc", ("", ""))[-1]
            why = err.get("ctx", {}).get("error", msg)
            loc, msg = "request", f"the body is not valid JSON ({why} at character {at})"
        problems.append(f"{loc}: {msg}")
    return "; ".join(problems)


def allowed_methods(request: Request) -> list[str]:
    """The methods the API describes at this request's path (Starlette's own 405 names only the
    methods of the first route that matched the path), and OPTIONS. Not HEAD: the API's routes
    do not answer it (Prometheus' /metrics, a separate server, does)."""
    path = request.url.path
    methods = {method for method, pattern, _ in request.app.state.operations if pattern.fullmatch(path)}
    return sorted(methods | {"OPTIONS"}) if methods else []


def path_pattern(template: str) -> re.Pattern[str]:
    """The paths an OpenAPI path template (`/v1/runs/{ref}`) stands for."""
    return re.compile(re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(template)))


def _method_not_allowed(request: Request) -> Response:
    allow = ", ".join(allowed_methods(request))
    if request.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    message = f"{request.method} is not allowed on {request.url.path}: use {allow}"
    return error_response(405, "method_not_allowed", message, headers={"Allow": allow})
