"""The runs tab: one row per run with its state, GPUs, progress and ETA, throughput and retunes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from gpuwarden.core.units import duration, num
from gpuwarden.tui.backend import RunRow
from gpuwarden.tui.formatting import bar, eta_seconds, progress_fraction

STATE_STYLES = {
    "running": "bold green",
    "starting": "green",
    "retuning": "bold magenta",
    "queued": "cyan",
    "succeeded": "blue",
    "failed": "bold red",
    "stopped": "yellow",
    "interrupted": "bold yellow",
}


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


class RunsPane(Vertical):
    """The table, and below it the selected run's one-line message."""

    DEFAULT_CSS = """
    RunsPane #runs-table { height: 1fr; }
    RunsPane #run-message { height: 1; padding: 0 1; color: $text-muted; }
    """

    class OpenRun(Message):
        """The user chose a run (enter)."""

        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    def __init__(self, *, readonly: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.readonly = readonly
        self._runs: dict[str, RunRow] = {}
        self._order: list[str] = []

    def compose(self) -> ComposeResult:
        table: DataTable[str | Text] = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        table.add_column("State", key="state")
        table.add_column("Name", key="name")
        table.add_column("GPU", key="gpus")
        table.add_column("Progress", key="progress")
        table.add_column("ETA", key="eta")
        table.add_column("smp/s", key="rate")
        table.add_column("Retunes", key="retunes")
        table.add_column("ID", key="id")
        yield table
        yield Static(id="run-message")

    @staticmethod
    def _cells(run: RunRow) -> tuple[str | Text, ...]:
        fraction = progress_fraction(run)
        progress = Text(bar(fraction, 8), style="green")
        progress.append(f" {num(None if fraction is None else 100 * fraction, '>3.0f', '%')}")
        retunes = Text(str(run.retunes), style="magenta" if run.retunes else "dim")
        return (
            state_text(run.state),
            run.name[:20],
            ",".join(map(str, run.placed)) or "–",
            progress,
            duration(eta_seconds(run)),
            num(run.samples_per_s, ".1f"),
            retunes,
            run.id[:8],
        )

    def show(self, runs: list[RunRow]) -> None:
        """Update in place when the rows are the same runs in the same order; rebuild otherwise,
        keeping the cursor on the same run."""
        table: DataTable[str | Text] = self.query_one("#runs-table", DataTable)
        order = [r.id for r in runs]
        if order == self._order:
            for run in runs:
                if self._runs.get(run.id) != run:
                    for column, value in zip(
                        ("state", "name", "gpus", "progress", "eta", "rate", "retunes", "id"),
                        self._cells(run),
                        strict=True,
                    ):
                        table.update_cell(run.id, column, value)
        else:
            selected = self.selected_id()
            table.clear()
            for run in runs:
                table.add_row(*self._cells(run), key=run.id)
            if selected in order:
                table.move_cursor(row=order.index(selected))
        self._runs = {r.id: r for r in runs}
        self._order = order
        self._show_message()

    def selected_id(self) -> str | None:
        table: DataTable[str | Text] = self.query_one("#runs-table", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def selected(self) -> RunRow | None:
        run_id = self.selected_id()
        return self._runs.get(run_id) if run_id else None

    def _show_message(self) -> None:
        run = self.selected()
        text = Text()
        if run is not None:
            text.append(f"{run.name}: ", style="bold")
            text.append(run.message or run.state)
        elif not self._runs:
            text.append(
                "No runs yet — submit one with `gpuwarden run SPEC`" + ("." if self.readonly else " or n.")
            )
        self.query_one("#run-message", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_message()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.OpenRun(event.row_key.value))
