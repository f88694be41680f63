"""The dashboard's own log (`gpuwarden tui --log FILE`): what it told the user, when it
connected, and why a live stream ended, one timestamped line each. Over SSH the screen is gone
once the session ends; the log says afterwards what the dashboard saw."""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwarden.core.errors import UserError

LOG = logging.getLogger("gpuwarden.tui")
# Without --log the lines go nowhere: never to the root logger, whose fallback writes warnings to
# stderr, under the dashboard.
LOG.propagate = False
LOG.addHandler(logging.NullHandler())


def open_session_log(path: Path) -> None:
    """Append the dashboard's lines to `path` (created if missing)."""
    try:
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"--log {path}: cannot write there ({exc.strerror}) — name a file in a directory you can write"
        ) from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
