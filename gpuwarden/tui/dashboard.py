"""What the screens and the app's parts read of the dashboard's state. The app is one; the screens
see it through this, never the app's class, so nothing below the app imports it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpuwarden.tui.backend import DashboardBackend, SourceStatus
from gpuwarden.tui.controls import OFFLINE
from gpuwarden.tui.live import LiveState

READONLY = "read-only: this dashboard shows, it does not act (start it without --readonly or --db)"


class Dashboard(Protocol):
    backend: DashboardBackend
    readonly: bool
    connected: bool
    status: SourceStatus | None
    live: LiveState
    clock: Callable[[], float]
    cwd: Path | None  # where relative spec paths are read from (the shell's directory)

    def control_refusal(self) -> str | None:
        """Why no control can run now (read-only, or no daemon), else None."""
        ...


def control_refusal(readonly: bool, connected: bool) -> str | None:
    """Why no control can run (read-only, or no daemon), else None."""
    if readonly:
        return READONLY
    if not connected:
        return OFFLINE
    return None
