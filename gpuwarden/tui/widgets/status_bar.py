"""The top line: which machine, where the data comes from, whether it is live, and the time of the
last sample. Offline, it says so in words with what brings the daemon back; while the daemon cannot
write its store, it says what and the fix."""

from __future__ import annotations

import re

from rich.cells import cell_len
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


STORAGE_LABEL = "storage: "
# An absolute path of two parts or more, where a word starts (not the end of a URL or a ratio).
_PATH = re.compile(r"(?<![^\s(])(?:/[^\s/:()]+){2,}")


def short_paths(text: str) -> str:
    """Each absolute path in `text` as `…/` and its last part: on a narrow line the file's name
    says which file, its folders are what can be spared (`gpuwarden status` prints them)."""
    return _PATH.sub(lambda m: "…/" + m.group(0).rsplit("/", 1)[-1], text)


def storage_warning(fault: str, width: int) -> Text:
    """`storage: <fault>` in `width` cells: whole if it fits, else with short paths, else cut at
    its end (what cannot be written comes first in the daemon's line, the fix after it)."""
    room = max(0, width - len(STORAGE_LABEL))
    body = Text(fault if cell_len(fault) <= room else short_paths(fault))
    body.truncate(room, overflow="ellipsis")
    return Text.assemble((STORAGE_LABEL, "bold yellow"), (body.plain, "yellow"))


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
        width = self.size.width or self.app.size.width - 2  # inside the padding
        if status.storage_fault:
            self.update(_with_fault(status, status.storage_fault, tail, width))
            return
        source = f"  {status.source} "
        room = width - line.cell_len - tail.cell_len - len(source)
        line.append(source, style="bold")
        line.append(_fit_path(status.location, max(0, room)), style="dim")
        self.update(line + tail)


def _with_fault(status: SourceStatus, fault: str, tail: Text, width: int) -> Text:
    """The fault in place of the data's source. The name, then the host, then the tail give way
    before any of the fault; then its folders, and last its end."""
    host = Text.assemble((status.host, "bold cyan"), "  ") if status.host else Text()
    named = Text.assemble(("gpuwarden", "bold"), "  ", host)
    for text in (fault, short_paths(fault)):
        for before, after in ((named, tail), (host, tail), (Text(), tail)):
            if before.cell_len + len(STORAGE_LABEL) + cell_len(text) + after.cell_len <= width:
                return before + storage_warning(text, width) + after
    return storage_warning(fault, width)
