"""The top line: where the data comes from, whether it is live, and the time of the last sample."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.tui.backend import SourceStatus
from gpuwarden.tui.formatting import clock


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar {
        height: 1;
        background: $panel;
        padding: 0 1;
    }
    """

    def show(
        self, status: SourceStatus | None, *, connected: bool, last_ts: float | None, readonly: bool
    ) -> None:
        line = Text()
        line.append("gpuwarden", style="bold")
        if status is None:
            line.append("  connecting…", style="yellow")
            self.update(line)
            return
        line.append(f"  {status.source}", style="bold")
        line.append(f" {status.location}", style="dim")
        if not connected:
            line.append("  reconnecting…", style="bold yellow")
        if readonly:
            line.append("  read-only", style="bold magenta")
        if last_ts is not None:
            line.append(f"  {clock(last_ts)}")
        self.update(line)
