"""The hosts tab (`gpuwarden tui --host A --host B`): every GPU of every host in one table (host,
card, memory free, utilisation, power, the run on it), the most free memory first (`f` sorts by
host instead), and under it one line for each host that shows nothing and why. Enter on a GPU
with a run opens that run's screen, on the host that owns it."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from gpuwarden.client.fleet_view import FleetGpu, by_free_memory
from gpuwarden.client.hosts import HostAnswer
from gpuwarden.core.units import MISSING, size
from gpuwarden.tui.backend import HostsSource
from gpuwarden.tui.formatting import cut
from gpuwarden.tui.requests import OpenRun
from gpuwarden.tui.widgets.nav_table import NavTable

POLL_S = 2.0
# (key, label, width): fits 80 columns with the table's padding.
COLUMNS = (
    ("host", "Host", 8),
    ("gpu", "GPU", 3),
    ("name", "Card", 20),
    ("free", "Free", 8),
    ("util", "Util", 5),
    ("power", "Power", 6),
    ("run", "Run", 11),
)


def cells(row: FleetGpu) -> tuple[str | Text, ...]:
    if row.lost:
        lost = Text("LOST", style="bold red")
        return (cut(row.host, 8), str(row.index), cut(row.name, 20), lost, "", "", "")
    util = MISSING if row.util is None else f"{row.util:.0f}%"
    power = MISSING if row.power_w is None else f"{row.power_w:.0f} W"
    return (
        cut(row.host, 8),
        str(row.index),
        cut(row.name.removeprefix("NVIDIA "), 20),
        size(row.mem_free),
        util,
        power,
        ",".join(row.runs) or "–",
    )


class HostsPane(Vertical):
    DEFAULT_CSS = """
    HostsPane #hosts-table { height: 1fr; }
    HostsPane #hosts-down { height: auto; max-height: 6; padding: 0 1; color: $warning; }
    HostsPane #hosts-foot { height: 1; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("f", "toggle_sort", "Sort")]

    def __init__(self, source: HostsSource, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.source = source
        self.by_host = False
        self.answers: list[HostAnswer[list[FleetGpu]]] = []

    def compose(self) -> ComposeResult:
        yield NavTable(id="hosts-table")
        yield Static(id="hosts-down")
        yield Static(id="hosts-foot")

    def on_mount(self) -> None:
        table = self.query_one("#hosts-table", NavTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        self.set_interval(POLL_S, self.reload)
        self.reload()

    def reload(self) -> None:
        self.run_worker(self._read, thread=True, group="hosts", exclusive=True, exit_on_error=False)

    def _read(self) -> None:
        answers = self.source.gpu_rows()
        self.app.call_from_thread(self.show, answers)

    def show(self, answers: list[HostAnswer[list[FleetGpu]]]) -> None:
        self.answers = answers
        rows = [row for a in answers for row in a.value or []]
        if not self.by_host:
            rows = by_free_memory(rows)
        table = self.query_one("#hosts-table", NavTable)
        cursor = table.cursor_row
        table.clear()
        for row in rows:
            table.add_row(*cells(row), key=f"{row.host}/{row.index}/{','.join(row.runs)}")
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))
        down = [f"host {a.host}: {a.error}" for a in answers if not a.ok]
        self.query_one("#hosts-down", Static).update(Text("\n".join(down)))
        up = sum(a.ok for a in answers)
        order = "host" if self.by_host else "free memory"
        self.query_one("#hosts-foot", Static).update(
            f"{len(rows)} GPUs on {up} of {len(answers)} hosts, by {order} (f: sort by "
            f"{'free memory' if self.by_host else 'host'})"
        )

    def action_toggle_sort(self) -> None:
        self.by_host = not self.by_host
        self.show(self.answers)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        runs = (event.row_key.value or "").rsplit("/", 1)[-1]
        if runs:
            self.app.post_message(OpenRun(runs.split(",")[0]))
