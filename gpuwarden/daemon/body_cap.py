"""Refusing an oversized request body before it is in memory.

A request that declares a `content-length` over the cap is answered 413 at once, whichever
operation it names: the app is never called and the body stays in the client's socket (uvicorn
stops reading a connection whose body nobody reads). A body sent in chunks, without a length, is
counted as the operation reads it and refused the moment it passes the cap.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuwarden.daemon.http_errors import error_response, too_large_message


class BodyCap:
    """ASGI middleware: 413 for a request body larger than `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await error_response(413, "too_large", too_large_message(self.limit))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                # Raised inside the operation's body read: the API's error handler answers it.
                raise HTTPException(413)
            return message

        await self.app(scope, counted, send)
