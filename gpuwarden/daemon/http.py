"""The HTTP+JSON API under /v1 (FastAPI): the app factory.

Every failure answers `{"error": {"code": ..., "message": "one line"}}` with a 4xx status for
anything a client can cause; a 500 means a daemon bug (`http_errors`). The resources' routers
live in `gpuwarden.daemon.routes`, one module each; request bodies are capped, and refused by
an operation that takes none (`body_cap`).
"""

from __future__ import annotations

import sqlite3

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuwarden import __version__
from gpuwarden.core.errors import UserError
from gpuwarden.daemon import http_errors
from gpuwarden.daemon.body_cap import BodyCap, operations_of
from gpuwarden.daemon.http_errors import MAX_BODY_BYTES
from gpuwarden.daemon.routes import (
    gpus,
    health,
    history,
    host_processes,
    processes,
    run_output,
    run_records,
    runs,
    stream,
)
from gpuwarden.daemon.routes.daemon_view import DaemonView

_ROUTERS = (health, gpus, host_processes, processes, history, runs, run_records, run_output, stream)


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
    # Each operation's body limit is read from its route: one that takes no body refuses any.
    app.state.operations = operations_of(
        r for m in _ROUTERS for r in m.router.routes if isinstance(r, APIRoute)
    )
    app.add_middleware(BodyCap, limit=MAX_BODY_BYTES, operations=app.state.operations)
    app.add_exception_handler(RequestValidationError, http_errors.invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(UserError, http_errors.user_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_errors.http_error)  # type: ignore[arg-type]
    app.add_exception_handler(OSError, http_errors.storage_error)
    app.add_exception_handler(sqlite3.Error, http_errors.storage_error)
    app.add_exception_handler(Exception, http_errors.bug)
    return app
