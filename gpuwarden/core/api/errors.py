"""The one error shape every failed request answers with."""

from __future__ import annotations

from pydantic import Field

from gpuwarden.core.api.base import ApiModel


class ErrorDetail(ApiModel):
    code: str = Field(description="machine-readable: not_found, conflict, bad_input, invalid_config, …")
    message: str = Field(description="one line: the problem and the fix")
    problems: list[str] | None = Field(
        None, description="invalid_config only: one line per problem, `file:line: key: problem — fix`"
    )


class ErrorBody(ApiModel):
    """`{"error": {"code": ..., "message": "one line"}}`, with a 4xx status for anything a client
    can cause; a 500 means a daemon bug."""

    error: ErrorDetail
