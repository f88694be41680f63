"""The HTTP+JSON API under /v1 (FastAPI): the app factory and the one error shape.

Every failure answers `{"error": {"code": ..., "message": "one line"}}` with a 4xx status for
anything a client can cause; a 500 means a daemon bug. The resources' routers live in
`gpuwarden.daemon.routes`, one module each.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuwarden import __version__
from gpuwarden.core.api import ErrorBody, ErrorDetail
from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.daemon.routes import gpus, health, history, processes, run_output, run_records, runs, stream
from gpuwarden.daemon.routes.daemon_view import DaemonView

log = logging.getLogger("gpuwarden.daemon.http")

_STATUS_BY_CODE = {
    "not_found": 404,
    "conflict": 409,
    "already_running": 409,
    "ambiguous": 400,
    "invalid_config": 422,
    "invalid_request": 422,
}
_ROUTERS = (health, gpus, processes, history, runs, run_records, run_output, stream)


def create_app(daemon: DaemonView) -> FastAPI:
    """The FastAPI application serving `daemon`."""
    app = FastAPI(
        title="gpuwarden",
        version=__version__,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.daemon = daemon
    for module in _ROUTERS:
        app.include_router(module.router)
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(UserError, _user_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _bug)
    return app


def error_response(status: int, code: str, message: str, problems: list[str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, problems=problems))
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status)


def one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "error"


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, "invalid_request", _validation_message(exc))


async def _user_error(request: Request, exc: UserError) -> JSONResponse:
    problems = exc.problems if isinstance(exc, ConfigError) else None
    return error_response(_STATUS_BY_CODE.get(exc.code, 400), exc.code, one_line(str(exc)), problems=problems)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = one_line(str(exc.detail))
    if exc.status_code == 400 and message == "There was an error parsing the body":
        # FastAPI's words for a body that is not UTF-8 JSON at all.
        code = "bad_input"
        message = "the body is not UTF-8 JSON: send a JSON object (see /v1/openapi.json)"
    response = error_response(exc.status_code, code, message)
    response.headers.update(exc.headers or {})
    return response


async def _bug(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, "internal", f"daemon error: {type(exc).__name__}: {exc}")


def _validation_message(exc: RequestValidationError) -> str:
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
    return one_line("; ".join(problems))
