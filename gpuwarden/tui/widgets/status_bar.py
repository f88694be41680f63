"""The top line: which machine, where the data comes from, whether it is live, and the time of the
last sample. Offline, it says so in words with what brings the daemon back."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.tui.backend import SourceStatus
from gpuwarden.tui.controls import OFFLINE
from gpuwarden.tui.formatting import clock


def _fit_path(path: str, room: int) -> str:
    """A path shortened from the left to `room` cells (its end names it best)."""
    if len(path) <= room:
        return path
    return "…" + path[-(room - 1) :] if room > 1 else ""


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
        if status.host:
            line.append(f"  {status.host}", style="bold cyan")
        if not connected:
            line.append(f"  {OFFLINE}", style="bold yellow")
            if line.cell_len > (self.size.width or self.app.size.width) - 2:
                line = line[len("gpuwarden  ") :]  # the message matters more than the name
            self.update(line)
            return
        tail = Text()
        if readonly:
            tail.append("  read-only", style="bold magenta")
        if last_ts is not None:
            tail.append(f"  {clock(last_ts)}")
        source = f"  {status.source} "
        room = (self.size.width or self.app.size.width) - 2 - line.cell_len - tail.cell_len - len(source)
        line.append(source, style="bold")
        line.append(_fit_path(status.location, max(0, room)), style="dim")
        self.update(line + tail)
