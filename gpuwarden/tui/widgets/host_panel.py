"""Host CPU and memory on one line, with bars: GPU jobs starve when the data loaders do."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.core.telemetry.types import HostSample
from gpuwarden.core.units import gib, num
from gpuwarden.tui.formatting import bar


class HostPanel(Static):
    DEFAULT_CSS = """
    HostPanel {
        height: 1;
        padding: 0 1;
    }
    """

    def show(self, host: HostSample | None, width: int) -> None:
        if host is None:
            self.update(Text("host: no reading yet", style="dim"))
            return
        bar_width = max(6, (width - 58) // 2)
        cpu = None if host.cpu_percent is None else host.cpu_percent / 100
        mem = host.mem_used / host.mem_total if host.mem_used is not None and host.mem_total else None
        line = Text()
        line.append("host ", style="bold")
        line.append(f"cpu {num(host.cpu_percent, '>3.0f', '%')} ")
        line.append(bar(cpu, bar_width), style="cyan")
        line.append(f"  mem {gib(host.mem_used)}/{gib(host.mem_total)} GiB ")
        line.append(bar(mem, bar_width), style="cyan")
        line.append(f"  load {num(host.load1, '.2f')}")
        if host.swap_used:
            line.append(f"  swap {gib(host.swap_used)} GiB", style="yellow")
        self.update(line)
