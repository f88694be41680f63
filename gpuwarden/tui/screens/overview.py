"""The overview tab: a card per GPU, the host, and the processes at work — those holding GPU
memory and the active runs on the CPU (on a machine without a GPU, the host's runs alone) — then
the host in detail (each core, memory and swap, the heaviest processes) in the rows left. Without
a GPU the host's detail comes right after its summary line and takes the screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, VerticalScroll
from textual.events import Resize
from textual.message import Message
from textual.widgets import DataTable, Static

from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.core.units import size
from gpuwarden.tui.backend import ProcessInfo, RunRow
from gpuwarden.tui.formatting import cut
from gpuwarden.tui.live import LiveState
from gpuwarden.tui.metrics import ChartMetric
from gpuwarden.tui.widgets.gpu_card import GpuCard
from gpuwarden.tui.widgets.host_detail import MIN_ROWS, HostDetail
from gpuwarden.tui.widgets.host_panel import HostPanel
from gpuwarden.tui.widgets.nav_table import NavTable

WIDE = 140  # from this many columns the cards sit two abreast
CARD_TEXT = 3  # a card's lines above its chart
CHART_MIN, CHART_MAX = 2, 40  # rows of a card's chart: what the height leaves, within these

# (label, width): pid up to 7 digits, a user name, GPU index or "cpu", "123 GiB", a run id; the
# command takes what is left (27 cells at 80 columns, with the cells' padding and a scrollbar).
PROCESS_COLUMNS: tuple[tuple[str, int], ...] = (
    ("PID", 7),
    ("User", 8),
    ("GPU", 3),
    ("Memory", 8),
    ("Run", 11),
)
COMMAND_MIN = 27
NO_GPU_TABLE = 8  # the runs table's rows at most without a GPU: the host's detail has the rest


def cpu_runs(live: LiveState) -> list[RunRow]:
    """Active runs that hold no GPU: they work on the host's CPU."""
    return [
        r
        for r in live.runs_sorted()
        if (r.state in ACTIVE_STATES or r.state == RunState.QUEUED) and not r.placed and r.gpus in (0, None)
    ]


class OverviewPane(VerticalScroll):
    DEFAULT_CSS = """
    OverviewPane #no-gpu { color: $warning; padding: 0 1; margin-bottom: 1; height: auto; }
    OverviewPane #cards { height: auto; }
    OverviewPane.wide #cards { layout: grid; grid-size: 2; grid-gutter: 1 2; }
    OverviewPane.wide GpuCard { margin-bottom: 0; }
    OverviewPane.wide #host { margin-top: 1; }
    OverviewPane #proc-title { padding: 0 1; margin-top: 1; text-style: bold; height: 1; }
    OverviewPane #processes { height: auto; max-height: 12; }
    OverviewPane.no-gpu #processes { max-height: 8; }  /* NO_GPU_TABLE */
    OverviewPane #proc-empty { padding: 0 1; color: $text-muted; height: auto; }
    """

    class ProcessHighlighted(Message):
        """The selected process changed: the screen offers (or not) to terminate it."""

    def __init__(self, *, readonly: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.readonly = readonly
        self._processes: dict[int, ProcessInfo] = {}
        self._gpu_processes: list[ProcessInfo] = []
        self._cpu_runs: list[RunRow] = []
        self.has_gpus = True
        self._command_width = 0
        self._card_rows: tuple[int, int] | None = None  # (chart rows, cards) last laid out
        self._announced: ProcessInfo | None = None  # the selection the screen was last told of

    def compose(self) -> ComposeResult:
        yield Static(id="no-gpu")
        yield Container(id="cards")
        yield HostPanel(id="host")
        yield Static("GPU processes", id="proc-title")
        yield NavTable(id="processes")
        yield Static(id="proc-empty")
        yield HostDetail(id="host-detail")

    def on_mount(self) -> None:
        self.query_one("#no-gpu").display = False
        self._columns(self.app.size.width)

    def on_resize(self, event: Resize) -> None:
        self._columns(event.size.width)

    def _columns(self, total: int) -> None:
        """Widths fixed for a terminal width: the layout never jumps as processes come and go (and
        a repaint over SSH sends only the cells that changed); the command gets the rest."""
        fixed = sum(w for _, w in PROCESS_COLUMNS) + 2 * (len(PROCESS_COLUMNS) + 1) + 2
        command = max(COMMAND_MIN, total - fixed)
        if command == self._command_width:
            return
        self._command_width = command
        table = self.query_one("#processes", NavTable)
        table.clear(columns=True)
        for label, width in (*PROCESS_COLUMNS, ("Command", command)):
            table.add_column(label, width=width)
        self._fill()

    async def set_gpus(self, live: LiveState, sampling: str | None) -> None:
        """Mount one card per GPU (once); with none, say why in one line."""
        cards = self.query_one("#cards", Container)
        have = {c.uuid for c in cards.query(GpuCard)}
        new = [GpuCard(uuid) for uuid in live.gpus if uuid not in have]
        if new:
            await cards.mount_all(new)
        no_gpu = self.query_one("#no-gpu", Static)
        self.has_gpus = bool(live.gpus)
        self.set_class(not live.gpus, "no-gpu")
        cards.display = bool(live.gpus)
        # With GPUs the cards and their processes come first; without, the host's detail does.
        detail = self.query_one(HostDetail)
        self.move_child(detail, after=self.query_one("#proc-empty" if live.gpus else "#host"))
        if live.gpus:
            no_gpu.display = False
        else:
            no_gpu.update(f"No GPU cards: {sampling or 'the daemon reports no NVIDIA GPU'}")
            no_gpu.display = True

    def card_width(self) -> int:
        width = self.size.width or self.app.size.width
        if width >= WIDE:
            return (width - 2) // 2 - 4
        return max(40, width - 4)

    def show(
        self, live: LiveState, metric: ChartMetric, *, samples: bool, processes: bool, runs: bool = False
    ) -> None:
        self.set_class(self.app.size.width >= WIDE, "wide")
        self._fit_cards()
        self._fit_detail()
        width = self.card_width()
        if samples:
            for card in self.query(GpuCard):
                state = live.gpus.get(card.uuid)
                if state is not None:
                    card.show(state, metric, width)
            host = live.snapshot.host if live.snapshot else None
            self.query_one(HostPanel).show(host, width)
            self.query_one(HostDetail).show_host(host)
        if processes:
            self._gpu_processes = list(live.processes)
        if processes or runs:
            self._cpu_runs = cpu_runs(live)
            self._fill()
            self.query_one(HostDetail).show_top(live.top, {r.id: r.name for r in live.runs.values()})

    def _fit_cards(self) -> None:
        """Card charts take the height the processes table leaves (a tall terminal, taller charts)."""
        cards = list(self.query(GpuCard))
        if not cards:
            return
        rows = self._card_lines(len(cards))
        chart = max(CHART_MIN, min(CHART_MAX, (self._height() - self._fixed()) // rows - CARD_TEXT - 1))
        if (chart, len(cards)) == self._card_rows:
            return  # a new layout only when the height to share changed
        self._card_rows = (chart, len(cards))
        for card in cards:
            card.styles.height = CARD_TEXT + chart
            card.chart.styles.height = chart
        self.query_one("#cards").styles.grid_rows = f"{CARD_TEXT + chart}"

    def _height(self) -> int:
        return self.size.height or self.app.size.height - 6

    def _card_lines(self, cards: int) -> int:
        return -(-cards // (2 if self.has_class("wide") else 1))

    def _fixed(self) -> int:
        """Rows of all but the cards and the host's detail: the pane's top padding, the host line,
        the table's title, the table and its header."""
        table = min(12, max(1, len(self._processes))) + 1
        return 1 + 2 + 2 + table

    def _fit_detail(self) -> None:
        """The host's detail gets the rows the rest leaves, so it never makes the pane scroll:
        without a GPU most of the screen, with GPUs what the cards' charts (capped) do not take."""
        detail = self.query_one(HostDetail)
        if self.has_gpus:
            chart, cards = self._card_rows or (CHART_MAX, 0)
            used = self._fixed() + self._card_lines(cards) * (CARD_TEXT + chart + 1)
        else:
            runs = len(self._processes)
            # the pane's top padding, the no-GPU line and its margin, the host line, the runs'
            # title and its margin, the runs table with its header (and the line saying it is empty)
            used = 1 + 2 + 1 + 2 + min(NO_GPU_TABLE, 1 + runs) + (0 if runs else 1)
        rows = self._height() - used
        detail.display = rows >= MIN_ROWS
        detail.styles.height = max(rows, MIN_ROWS)

    def show_runs(self, live: LiveState) -> None:
        self._cpu_runs = cpu_runs(live)
        self._fill()
        self.query_one(HostDetail).show_top(live.top, {r.id: r.name for r in live.runs.values()})

    def _fill(self) -> None:
        table = self.query_one("#processes", NavTable)
        selected = self.selected_process()
        table.clear()
        shown: list[ProcessInfo] = sorted(
            self._gpu_processes,
            key=lambda p: (p.gpu_index if p.gpu_index is not None else -1, -(p.used_memory or 0)),
        )
        for p in shown:
            run = Text(p.run_id or "–", style="" if p.run_id else "dim")
            user = Text(p.user or "?", style="bold" if p.owned else "")
            gpu = "–" if p.gpu_index is None else str(p.gpu_index)
            command = cut(p.command, self._command_width)
            table.add_row(str(p.pid), user, gpu, size(p.used_memory), run, command, key=str(p.pid))
        cpu: list[ProcessInfo] = []
        for r in self._cpu_runs:
            if r.pid is None or any(p.pid == r.pid for p in shown):
                continue
            # The run's kind and state say what the process is doing: a long name is cut, not they.
            what = f" ({r.kind}, {r.state})"
            command = cut(r.name, self._command_width - len(what)) + what
            proc = ProcessInfo(r.pid, "", None, None, None, command, r.id, True)
            cpu.append(proc)
            table.add_row(
                str(r.pid), Text("you", style="bold"), "cpu", "–", r.id, proc.command, key=str(r.pid)
            )
        if selected is not None and any(p.pid == selected.pid for p in shown + cpu):
            table.move_cursor(row=table.get_row_index(str(selected.pid)))
        self._processes = {p.pid: p for p in shown + cpu}
        self._show_title(len(shown), len(cpu))
        self._fit_detail()

    def _show_title(self, on_gpus: int, on_cpu: int) -> None:
        title = self.query_one("#proc-title", Static)
        empty = self.query_one("#proc-empty", Static)
        if self.has_gpus:
            title.update(
                f"GPU processes ({on_gpus})" + (f" and runs on the CPU ({on_cpu})" if on_cpu else "")
            )
            empty.update("no process holds GPU memory")
        else:
            queued = sum(1 for r in self._cpu_runs if r.state == RunState.QUEUED)
            title.update(f"Runs on this host ({on_cpu} working" + (f", {queued} queued)" if queued else ")"))
            empty.update(
                "no run is working on the host"
                + (f" ({queued} queued)" if queued else "")
                + " — 2 lists every run"
                + ("" if self.readonly else ", n submits one")
            )
        empty.display = not (on_gpus or on_cpu)

    def selected_process(self) -> ProcessInfo | None:
        table: DataTable[str | Text] = self.query_one("#processes", NavTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self._processes.get(int(key)) if key is not None else None

    def kill_refusal(self) -> str | None:
        """Why `x` would not terminate the selected process (None: it is yours and no run's)."""
        proc = self.selected_process()
        if proc is None:
            return "no process selected"
        if not proc.owned:
            return f"process {proc.pid} belongs to {proc.user}: you can only terminate your own"
        if proc.run_id:
            return f"process {proc.pid} is run {proc.run_id}: stop the run instead (2, then s)"
        return None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # The table is rebuilt on every process read: say so only when the choice changed.
        selected = self.selected_process()
        if selected != self._announced:
            self._announced = selected
            self.post_message(self.ProcessHighlighted())
