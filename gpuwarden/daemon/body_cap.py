"""Refusing a request body the operation does not read, or one larger than it reads, before it
is in memory and before the operation acts.

Each operation's limit comes from its route, as the API's description (`/v1/openapi.json`) says
it: one with a request body reads at most `limit` bytes, one without (a shutdown, a resume, every
GET) reads none. A request that declares a `content-length` over its operation's limit is
answered 413 at once: the app is never called. A body sent in chunks, without a length, is
counted as the operation reads it and refused the moment it passes the cap; sent to an operation
that reads none, its first chunk is awaited before the app is called, since that operation never
reads its body and would otherwise act (stop the daemon, resume a run) whatever came with it.
Refusals close the connection, so the daemon reads no more of a body it has refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuwarden.daemon.http_errors import CLOSE, error_response, path_pattern, too_large_message

# An operation by its method and its path's pattern, and whether it reads a body.
Operations = list[tuple[str, re.Pattern[str], bool]]


# The methods whose operations the API's description gives a request body (FastAPI's rule).
_BODY_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def operations_of(routes: Iterable[APIRoute]) -> Operations:
    """Every operation of the routers' routes that the API describes, in their order. Read from
    the routes, not from the OpenAPI description: building that keeps about 7 MB resident in the
    daemon for a question the routes answer."""
    return [
        (method, path_pattern(route.path_format), method in _BODY_METHODS and route.body_field is not None)
        for route in routes
        if route.include_in_schema
        for method in sorted(route.methods or ())
    ]


class BodyCap:
    """ASGI middleware: 413 for a request body larger than its operation reads (`limit` bytes
    where the operation reads one, none where it does not)."""

    def __init__(self, app: ASGIApp, limit: int, operations: Operations) -> None:
        self.app = app
        self.limit = limit
        self._operations = operations

    def reads_a_body(self, method: str, path: str) -> bool:
        """Whether the operation at `method path` reads a body; a request that names no operation
        is the app's to answer (404, 405), with the cap of any body."""
        for op_method, pattern, reads in self._operations:
            if op_method == method and pattern.fullmatch(path):
                return reads
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        limit = self.limit if self.reads_a_body(method, path) else 0
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await self._refusal(limit, method, path)(scope, receive, send)
            return
        if limit == 0 and "transfer-encoding" in headers:
            first = await _first_chunk(receive)
            if first.get("body"):
                await self._refusal(limit, method, path)(scope, receive, send)
                return
            receive = _replaying(first, receive)
        await self.app(scope, _counted(receive, limit), send)

    def _refusal(self, limit: int, method: str, path: str) -> Any:
        if limit:
            return error_response(413, "too_large", too_large_message(limit), headers=CLOSE)
        message = f"{method} {path} takes no request body: send the request without one"
        return error_response(413, "unexpected_body", message, headers=CLOSE)


async def _first_chunk(receive: Receive) -> Message:
    """The first message that carries a byte of the body or ends it (or a disconnect)."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or message.get("body") or not message.get("more_body"):
            return message


def _replaying(first: Message, receive: Receive) -> Receive:
    """`receive` that answers `first` once before reading on."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


def _counted(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            # Raised inside the operation's body read: the API's error handler answers it.
            raise HTTPException(413)
        return message

    return counted
