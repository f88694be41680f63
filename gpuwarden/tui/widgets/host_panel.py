"""Host CPU and memory on one line, with bars: GPU jobs starve when the data loaders do."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.core.telemetry.types import HostSample
from gpuwarden.core.units import gib, num
from gpuwarden.tui.formatting import bar, first_that_fit


class HostPanel(Static):
    DEFAULT_CSS = """
    HostPanel {
        height: 1;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.shown: tuple[HostSample | None, int] | None = None

    def show(self, host: HostSample | None, width: int) -> None:
        """Redraw for `host`; `width` is the line's width until the panel is laid out."""
        self.shown = (host, width)
        self.refresh()

    def render(self) -> Text:
        if self.shown is None:
            return Text()
        host, hint = self.shown
        return host_line(host, self.content_size.width or hint)


def host_line(host: HostSample | None, width: int) -> Text:
    """CPU and memory with bars, then swap in use (a warning) and the load, where they fit."""
    if host is None:
        return Text("host: no reading yet", style="dim")
    cpu = f"cpu {num(host.cpu_percent, '>3.0f', '%')} "
    memory = f"mem {gib(host.mem_used)}/{gib(host.mem_total)} GiB "
    extras = [Text(f"swap {gib(host.swap_used)} GiB", style="yellow")] if host.swap_used else []
    extras.append(Text(f"load {num(host.load1, '.2f')}"))
    text_width = len("host ") + len(cpu) + 2 + len(memory) + sum(2 + extra.cell_len for extra in extras)
    bar_width = min(max(6, (width - 58) // 2), max(2, (width - text_width) // 2))
    cpu_used = None if host.cpu_percent is None else host.cpu_percent / 100
    mem_used = host.mem_used / host.mem_total if host.mem_used is not None and host.mem_total else None
    cpu_part = Text("host ", style="bold")
    cpu_part.append(cpu)
    cpu_part.append(bar(cpu_used, bar_width), style="cyan")
    mem_part = Text(memory)
    mem_part.append(bar(mem_used, bar_width), style="cyan")
    return first_that_fit([cpu_part, mem_part, *extras], width)
