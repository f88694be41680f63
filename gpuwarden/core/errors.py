"""Errors a user can cause and fix.

The CLI prints a `UserError` as its message alone (no traceback) and exits with status 2; the API
turns it into a JSON error with a 4xx status. Anything else that escapes is a bug.
"""

from __future__ import annotations


def one_line(text: str | BaseException) -> str:
    """A possibly multi-line message as the one line an error event, a log line or an API error
    carries: its non-blank lines joined with "; " ("error" when there is nothing)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip()) or "error"


class UserError(Exception):
    """A problem in the user's input or environment, with the fix in its message."""

    def __init__(self, message: str, *, code: str = "bad_input") -> None:
        super().__init__(message)
        self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(UserError):
    """A configuration or run spec that does not validate; one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems), code="invalid_config")
