"""The error answers each operation documents, all in the one error shape (`ErrorBody`)."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.api import ErrorBody
from gpuwarden.daemon.http_errors import too_large_message

_WHY = {
    400: "bad input, in one line with the fix: a value the operation cannot use, a body that is not JSON",
    404: "no such run, attempt, GPU or process",
    409: "the run's state (or the process's owner) does not allow this now, or the reference "
    "matches several runs (`ambiguous`: give more of the id)",
    413: f"{too_large_message()} (`too_large`); or a body sent to an operation that takes none "
    "(`unexpected_body`)",
    415: "the body was sent as another type than JSON (`Content-Type: application/json`)",
    422: "a parameter or the body does not validate (`invalid_request`), or the spec does not "
    "(`invalid_config`, one line per problem in `problems`), or an Idempotency-Key came before with "
    "another request (`key_reused`)",
    503: "the submit could not be queued before the time the client stops waiting "
    "(X-Gpuwarden-Deadline): nothing was queued (`deadline`)",
    507: "the daemon cannot write its database or state folder: the disk is full (`storage_full`), "
    "or a file or folder there cannot be written — a read-only mount, an immutable flag, another "
    "user's (`storage_unwritable`); the message names it and the fix, and /v1/health reports it",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for an operation that can fail with `statuses` (413 is always possible: every
    request's body is capped, at none for an operation that takes no body)."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in sorted({*statuses, 413})}


def json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`errors()` for an operation whose own answer is not JSON (the stream): the error body is
    still JSON. (FastAPI would file a `model` under the operation's own media type.)"""
    body = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}}}
    return {status: {"description": _WHY[status], "content": body} for status in sorted({*statuses, 413})}


# The statuses an operation on one run can answer besides its own: the reference resolves to
# no run (404) or to several (400), and the parameters are checked (422).
ON_A_RUN = (400, 404, 409, 422)
# An operation that reads a JSON body can also be sent one of another type.
WITH_A_BODY = 415
# An operation that writes can find the disk under the state full or unwritable.
WRITES = 507
