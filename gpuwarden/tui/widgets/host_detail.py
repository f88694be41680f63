"""The host in detail, in the rows the overview leaves it: each core, memory and swap, the
heaviest processes. On a machine without a GPU this is most of the overview."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.widgets import Static

from gpuwarden.core.telemetry.types import HostSample
from gpuwarden.core.units import gib
from gpuwarden.tui.backend import HostTop
from gpuwarden.tui.formatting import bar
from gpuwarden.tui.widgets.core_bars import core_lines
from gpuwarden.tui.widgets.top_table import top_lines

MIN_ROWS = 3  # fewer rows than this (GPU cards took the rest) show nothing: a sliver tells little
TOP_ROWS = 5  # the processes' title, header and three rows: the cores leave at least these
MEMORY_BAR_MAX = 40


class HostDetail(Static):
    DEFAULT_CSS = """
    HostDetail {
        height: auto;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.host: HostSample | None = None
        self.top: HostTop | None = None
        self.runs: Mapping[str, str] = {}

    def show_host(self, host: HostSample | None) -> None:
        self.host = host
        self.refresh()

    def show_top(self, top: HostTop | None, runs: Mapping[str, str]) -> None:
        """The processes, and the names of gpuwarden's runs (id → name) to mark theirs."""
        self.top, self.runs = top, runs
        self.refresh()

    def render(self) -> Text:
        width, height = self.content_size
        return Text("\n").join(detail_lines(self.host, self.top, self.runs, width, height))


def detail_lines(
    host: HostSample | None, top: HostTop | None, runs: Mapping[str, str], width: int, rows: int
) -> list[Text]:
    """The cores, memory and swap, then the processes in the rows left (the host line above
    already says when there is no reading)."""
    if rows < MIN_ROWS or width < 20:
        return []
    lines: list[Text] = []
    if host is not None:
        lines += core_lines(host.cpu_cores or [], width, max(1, rows - 1 - TOP_ROWS))
        lines.append(memory_line(host, width))
    return lines + top_lines(top, runs, width, rows - len(lines))


def memory_line(host: HostSample, width: int) -> Text:
    """Memory and swap in use, each a bar with used/total."""
    mem = f" {gib(host.mem_used)}/{gib(host.mem_total)} GiB"
    swap = f" {gib(host.swap_used)}/{gib(host.swap_total)} GiB" if host.swap_total else " none"
    bar_width = min(MEMORY_BAR_MAX, (width - len("mem ") - len(mem) - len("   swap ") - len(swap)) // 2)
    line = Text("mem ", style="bold", no_wrap=True)
    line.append(bar(_share(host.mem_used, host.mem_total), bar_width), style="cyan on grey15")
    line.append(mem + "   ")
    line.append("swap ", style="bold")
    if host.swap_total:
        style = "yellow on grey15" if host.swap_used else "cyan on grey15"
        line.append(bar(_share(host.swap_used, host.swap_total), bar_width), style=style)
    line.append(swap)
    return line


def _share(used: int | None, total: int | None) -> float | None:
    return used / total if used is not None and total else None
