"""The overview tab: a card per GPU, the host, and the processes holding GPU memory."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, VerticalScroll
from textual.widgets import DataTable, Static

from gpuwarden.core.units import size
from gpuwarden.tui.backend import ProcessInfo
from gpuwarden.tui.live import LiveState
from gpuwarden.tui.metrics import ChartMetric
from gpuwarden.tui.widgets.gpu_card import GpuCard
from gpuwarden.tui.widgets.host_panel import HostPanel

WIDE = 140  # from this many columns the cards sit two abreast
TALL = 40  # from this many rows the card charts get taller


# (label, width): pid up to 7 digits, a user name, GPU index, "123.4 GiB", a run id, the command.
PROCESS_COLUMNS: tuple[tuple[str, int], ...] = (
    ("PID", 7),
    ("User", 8),
    ("GPU", 3),
    ("Memory", 9),
    ("Run", 11),
    ("Command", 29),
)  # 67 cells + 12 of padding: the whole table fits an 80-column SSH terminal


class OverviewPane(VerticalScroll):
    DEFAULT_CSS = """
    OverviewPane #no-gpu { color: $warning; padding: 0 1; margin-bottom: 1; height: auto; }
    OverviewPane #cards { height: auto; }
    OverviewPane.tall GpuCard { height: 8; }
    OverviewPane.tall GpuCard Chart { height: 5; }
    OverviewPane.wide #cards { layout: grid; grid-size: 2; grid-rows: 5; grid-gutter: 1 2; }
    OverviewPane.wide.tall #cards { grid-rows: 8; }
    OverviewPane.wide GpuCard { margin-bottom: 0; }
    OverviewPane.wide #host { margin-top: 1; }
    OverviewPane #proc-title { padding: 0 1; margin-top: 1; text-style: bold; height: 1; }
    OverviewPane #processes { height: auto; max-height: 12; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._processes: dict[int, ProcessInfo] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="no-gpu")
        yield Container(id="cards")
        yield HostPanel(id="host")
        yield Static("GPU processes", id="proc-title")
        table: DataTable[str | Text] = DataTable(id="processes", cursor_type="row", zebra_stripes=True)
        # Fixed widths: the layout never jumps as processes come and go (and a repaint over SSH
        # sends only the cells that changed).
        for label, width in PROCESS_COLUMNS:
            table.add_column(label, width=width)
        yield table

    def on_mount(self) -> None:
        self.query_one("#no-gpu").display = False

    async def set_gpus(self, live: LiveState, sampling: str | None) -> None:
        """Mount one card per GPU (once); with none, say why in one line."""
        cards = self.query_one("#cards", Container)
        have = {c.uuid for c in cards.query(GpuCard)}
        new = [GpuCard(uuid) for uuid in live.gpus if uuid not in have]
        if new:
            await cards.mount_all(new)
        no_gpu = self.query_one("#no-gpu", Static)
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

    def show(self, live: LiveState, metric: ChartMetric, *, samples: bool, processes: bool) -> None:
        self.set_class(self.app.size.width >= WIDE, "wide")
        self.set_class(self.app.size.height >= TALL, "tall")
        width = self.card_width()
        if samples:
            for card in self.query(GpuCard):
                state = live.gpus.get(card.uuid)
                if state is not None:
                    card.show(state, metric, width)
            self.query_one(HostPanel).show(live.snapshot.host if live.snapshot else None, width)
        if processes:
            self.show_processes(live.processes)

    def show_processes(self, processes: list[ProcessInfo]) -> None:
        table: DataTable[str | Text] = self.query_one("#processes", DataTable)
        selected = self.selected_process()
        table.clear()
        for p in sorted(
            processes, key=lambda p: (p.gpu_index if p.gpu_index is not None else -1, -(p.used_memory or 0))
        ):
            run = Text(p.run_id or "–", style="" if p.run_id else "dim")
            user = Text(p.user or "?", style="bold" if p.owned else "")
            gpu = "–" if p.gpu_index is None else str(p.gpu_index)
            table.add_row(str(p.pid), user, gpu, size(p.used_memory), run, p.command[:60], key=str(p.pid))
        if selected is not None and str(selected.pid) in {str(p.pid) for p in processes}:
            table.move_cursor(row=table.get_row_index(str(selected.pid)))
        self.query_one("#proc-title", Static).update(f"GPU processes ({len(processes)})")
        self._processes = {p.pid: p for p in processes}

    def selected_process(self) -> ProcessInfo | None:
        table: DataTable[str | Text] = self.query_one("#processes", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self._processes.get(int(key)) if key is not None else None
