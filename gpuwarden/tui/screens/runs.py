"""The runs tab: one row per run with its state, GPUs, progress and ETA, throughput and retunes;
`/` filters, `o` sorts, j/k/g/G move. Column widths follow the terminal: the name takes what is
left after the fixed columns, so nothing is cut at 80 columns and nothing is wasted at 200."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.events import Key, Resize
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.core.units import duration, num
from gpuwarden.tui.backend import RunRow
from gpuwarden.tui.formatting import bar, cut, eta_seconds, progress_fraction
from gpuwarden.tui.widgets.nav_table import NavTable

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
ID_WIDTH = 11  # "r" + 10 hex digits: a run id is never cut
# (key, label, width); the name's and the progress bar's widths are set from the terminal's.
FIXED: tuple[tuple[str, str, int], ...] = (
    ("state", "State", 11),
    ("name", "Name", 0),
    ("gpus", "GPU", 3),
    ("progress", "Progress", 0),
    ("eta", "ETA", 6),
    ("rate", "smp/s", 6),
    ("retunes", "Rt", 2),
    ("id", "ID", ID_WIDTH),
)
# What each column holds, as the help screen says it: the headers are short to fit 80 columns.
MEANINGS: dict[str, str] = {
    "state": "queued, starting, running, retuning, then succeeded, failed, stopped or interrupted",
    "host": "the machine the run is on (with several hosts)",
    "name": "the run's name (shortened in the middle when long)",
    "gpus": "the GPUs its latest attempt runs on, by index (cpu: it asked for none)",
    "progress": "how far its latest attempt has come, from what it reports",
    "eta": "time left at its recent speed",
    "rate": "samples (or items) a second, as the run reports them",
    "retunes": "retunes: how often an out-of-memory changed a setting and restarted it",
    "id": "the run's id, which every command takes (never shortened)",
}
HOST_WIDTH_CELLS = 6
# Runs of several hosts: a host column, in the room the throughput's takes (the run's screen has it).
WITH_HOST: tuple[tuple[str, str, int], ...] = (
    ("state", "State", 11),
    ("host", "Host", HOST_WIDTH_CELLS),
    ("name", "Name", 0),
    ("gpus", "GPU", 3),
    ("progress", "Progress", 0),
    ("eta", "ETA", 6),
    ("retunes", "Rt", 2),
    ("id", "ID", ID_WIDTH),
)
PADDING = 2  # a DataTable cell's padding, one each side
NAME_MIN, NAME_MAX = 12, 40
BAR_MIN, BAR_MAX = 4, 20


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def _active_first(run: RunRow) -> tuple[Any, ...]:
    rank = 0 if run.state in ACTIVE_STATES else 1 if run.state == RunState.QUEUED else 2
    return (rank, -run.created_at, run.id)


def _progress_key(run: RunRow) -> tuple[Any, ...]:
    fraction = shown_fraction(run)
    return (-(fraction if fraction is not None else -1.0), -run.created_at)


# Sort orders `o` cycles through: (label, key).
SORTS: tuple[tuple[str, Callable[[RunRow], Any]], ...] = (
    ("state", _active_first),
    ("newest", lambda r: (-r.created_at, r.id)),
    ("name", lambda r: (r.name.lower(), -r.created_at)),
    ("progress", _progress_key),
)


def shown_fraction(run: RunRow) -> float | None:
    """The progress a row shows: a run that succeeded did all its work, whatever it reported."""
    if run.state == RunState.SUCCEEDED:
        return 1.0
    return progress_fraction(run)


def widths(total: int, columns: tuple[tuple[str, str, int], ...] = FIXED) -> tuple[int, int]:
    """(name width, bar width) for a table `total` cells wide."""
    fixed = sum(w for _, _, w in columns) + PADDING * len(columns) + 1  # + a scrollbar's cell
    room = max(0, total - fixed)
    # The bar's digits take 5 cells (" 100%"); the name gets its minimum first, then the bar grows.
    name = max(NAME_MIN, min(NAME_MAX, room - BAR_MIN - 5))
    bar_width = max(BAR_MIN, min(BAR_MAX, room - name - 5))
    if name == NAME_MAX:
        name = max(NAME_MIN, min(NAME_MAX + 20, room - bar_width - 5))
    return name, bar_width


class FootLine(Static):
    """The line under the table: the selected run's message, cut to the room left by what is
    on the right. Cut when drawn, at the width it is drawn at: a width remembered from an
    earlier layout (the pane is laid out more than once as the dashboard starts) went stale.
    Its width is the pane's, never its content's: a padded line would size its own box."""

    DEFAULT_CSS = "FootLine { width: 1fr; }"

    def show(self, message: Text, info: Text) -> None:
        self._message, self._info = message, info
        self.refresh()

    def render(self) -> Text:
        message = getattr(self, "_message", Text())
        info = getattr(self, "_info", Text())
        room = max(0, self.content_size.width - info.cell_len)
        cut = message.copy()
        cut.truncate(room, overflow="ellipsis")
        cut.pad_right(room - cut.cell_len)
        return cut + info


class RunsPane(Vertical):
    """The table, a line with the selected run's message, and the filter line when filtering."""

    DEFAULT_CSS = """
    RunsPane #runs-table { height: 1fr; }
    RunsPane #runs-foot { height: 1; padding: 0 1; }
    RunsPane #runs-filter { height: 1; border: none; padding: 0 1; display: none; }
    RunsPane.-filtering #runs-filter { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter_runs", "Filter"),
        Binding("o", "sort_runs", "Sort"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    class OpenRun(Message):
        """The user chose a run (enter)."""

        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    class Highlighted(Message):
        """The selected run changed: the screen offers that run's controls."""

    def __init__(self, *, readonly: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.readonly = readonly
        self._all: list[RunRow] = []
        self._runs: dict[str, RunRow] = {}
        self._order: list[str] = []
        self._widths: tuple[int, int] | None = None
        self._pending: str | None = None  # a run to put the cursor on once it is listed
        self._announced: tuple[str, str] | None = None  # (run, state) the screen was last told of
        self.sort = 0
        self.query_text = ""
        self.columns = FIXED  # WITH_HOST once a run of a named host is shown
        self._laid = FIXED  # the columns the table has now

    @property
    def sort_label(self) -> str:
        return SORTS[self.sort][0]

    @property
    def table(self) -> DataTable[str | Text]:
        return self.query_one("#runs-table", NavTable)

    def compose(self) -> ComposeResult:
        yield NavTable(id="runs-table")
        yield Input(
            placeholder="part of a name, an id or a state; enter keeps it, esc clears", id="runs-filter"
        )
        yield FootLine(id="runs-foot")

    def on_mount(self) -> None:
        self._layout(self.size.width or self.app.size.width)

    def on_resize(self, event: Resize) -> None:
        self._layout(event.size.width)

    def _layout(self, total: int) -> None:
        """Columns sized for `total` cells; rebuilt only when that changes the widths."""
        wanted = widths(total, self.columns)
        if (wanted, self.columns) == (self._widths, self._laid):
            return
        self._widths, self._laid = wanted, self.columns
        name_w, bar_w = wanted
        table = self.table
        selected = self.selected_id()
        table.clear(columns=True)
        for key, label, width in self.columns:
            size = {"name": name_w, "progress": bar_w + 5}.get(key, width)
            table.add_column(label, key=key, width=size)
        self._order = []
        self._fill(selected)

    # -- rows ---------------------------------------------------------------------------------

    def _cells(self, run: RunRow) -> tuple[str | Text, ...]:
        name_w, bar_w = self._widths or widths(80, self.columns)
        fraction = shown_fraction(run)
        progress = Text(bar(fraction, bar_w), style="green")
        progress.append(f" {num(None if fraction is None else 100 * fraction, '>3.0f', '%'):>4}")
        retunes = Text(str(run.retunes), style="magenta" if run.retunes else "dim")
        gpus = ",".join(map(str, run.placed))
        if not gpus:
            gpus = "cpu" if run.gpus == 0 else "–"
        cells: dict[str, str | Text] = {
            "state": state_text(run.state),
            "host": cut(run.host or "", HOST_WIDTH_CELLS),
            "name": cut(run.name, name_w),
            "gpus": gpus,
            "progress": progress,
            "eta": duration(eta_seconds(run)),
            "rate": num(run.samples_per_s, ".1f"),
            "retunes": retunes,
            "id": run.id,
        }
        return tuple(cells[key] for key, _, _ in self.columns)

    def _visible(self) -> list[RunRow]:
        text = self.query_text.lower()
        shown = [r for r in self._all if not text or text in f"{r.name} {r.id} {r.state}".lower()]
        return sorted(shown, key=SORTS[self.sort][1])

    def show(self, runs: list[RunRow]) -> None:
        """Update in place when the rows are the same runs in the same order; rebuild otherwise,
        keeping the cursor on the same run."""
        self._all = list(runs)
        if self.columns is FIXED and any(r.host for r in runs):
            self.columns = WITH_HOST
            self._layout(self.size.width or self.app.size.width)
        self._fill(self.selected_id())

    def _fill(self, selected: str | None) -> None:
        if self._widths is None:
            return
        table = self.table
        runs = self._visible()
        order = [r.id for r in runs]
        if order == self._order:
            for run in runs:
                if self._runs.get(run.id) != run:
                    keys = (key for key, _, _ in self.columns)
                    for column, value in zip(keys, self._cells(run), strict=True):
                        table.update_cell(run.id, column, value)
        else:
            table.clear()
            for run in runs:
                table.add_row(*self._cells(run), key=run.id)
        self._runs = {r.id: r for r in runs}
        self._order = order
        target = self._pending if self._pending in order else selected
        if self._pending in order:
            self._pending = None
        if target in order and table.cursor_row != order.index(target):
            table.move_cursor(row=order.index(target))
        self._show_foot()
        self._announce()

    def _announce(self) -> None:
        """Tell the screen when the selected run, or its state, changed (its controls follow)."""
        run = self.selected()
        key = (run.id, run.state) if run else None
        if key != self._announced:
            self._announced = key
            self.post_message(self.Highlighted())

    def select(self, run_id: str) -> None:
        """Put the cursor on `run_id` now, or as soon as it is listed (a run just submitted)."""
        self._pending = run_id
        self._fill(self.selected_id())

    def selected_id(self) -> str | None:
        table = self.table
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def selected(self) -> RunRow | None:
        run_id = self.selected_id()
        return self._runs.get(run_id) if run_id else None

    def every_run(self) -> list[RunRow]:
        """Every run the daemon listed, the filter aside."""
        return list(self._all)

    def _show_foot(self) -> None:
        run = self.selected()
        text = Text()
        if run is not None:
            text.append(f"{run.name}: ", style="bold")
            text.append(run.message or str(run.state))
        elif self._all:
            text.append(f"no run matches '{self.query_text}' (esc clears the filter)", style="yellow")
        else:
            text.append(
                "No runs yet — submit one with `gpuwarden run SPEC`" + ("." if self.readonly else " or n.")
            )
        info = Text(style="dim")
        if self.query_text:
            info.append(f"  {len(self._order)} of {len(self._all)} · /{self.query_text}")
        info.append(f"  sorted by {self.sort_label}")
        self.query_one("#runs-foot", FootLine).show(text, info)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_foot()
        self._announce()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.OpenRun(event.row_key.value))

    # -- filter and sort ----------------------------------------------------------------------

    def action_filter_runs(self) -> None:
        self.add_class("-filtering")
        field = self.query_one("#runs-filter", Input)
        field.value = self.query_text
        # At once, not through `focus()`'s deferred call: `on_key` must find the filter focused
        # for the letters queued behind the `/`.
        self.screen.set_focus(field)

    def on_key(self, event: Key) -> None:
        """`/` and the letters after it, in the order typed. Over SSH `/stop` arrives in one
        packet: every key of it bubbles past here before the app runs the `/` binding, so the
        letters would go to the table's bindings (`s`: stop the run) and not to the filter."""
        field = self.query_one("#runs-filter", Input)
        if self.screen.focused is field and event.is_printable and event.character:
            event.stop()
            event.prevent_default()
            field.insert_text_at_cursor(event.character)
        elif event.key == "slash":
            event.stop()
            self.action_filter_runs()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_text = event.value.strip()
        self._fill(self.selected_id())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.query_text:
            self.remove_class("-filtering")
        self.table.focus()

    def action_clear_filter(self) -> None:
        """esc: drop the filter."""
        self.query_text = ""
        self.query_one("#runs-filter", Input).value = ""
        self.remove_class("-filtering")
        self.table.focus()
        self._fill(self.selected_id())

    def action_sort_runs(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self._fill(self.selected_id())
