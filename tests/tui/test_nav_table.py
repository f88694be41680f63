"""The dashboard's tables keep their look when a scrollbar beside them comes or goes."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from gpuwarden.tui.widgets.nav_table import NavTable
from tests.tui.conftest import run

WIDTH = 40


class Pane(App[None]):
    """A table above text that is long enough to scroll, as the overview's process table is."""

    CSS = "NavTable { height: auto; } #below { height: auto; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield NavTable()
            yield Static("line\n" * 30, id="below")

    def on_mount(self) -> None:
        table = self.query_one(NavTable)
        table.add_column("PID", width=10)
        table.add_column("Command", width=10)
        table.add_row("1", "python")


def test_the_header_spans_the_width_once_a_scrollbar_is_gone() -> None:
    async def body() -> None:
        app = Pane()
        async with app.run_test(size=(WIDTH, 12)) as pilot:
            await pilot.pause()
            table = app.query_one(NavTable)
            assert table.size.width < WIDTH  # the pane scrolls: its scrollbar takes the last cells
            header = table.get_component_styles("datatable--header").rich_style.bgcolor
            # A repaint of the table as it is, then the text below shrinks and the scrollbar goes.
            table.refresh()
            await pilot.pause()
            app.export_screenshot()
            app.query_one("#below", Static).update("line")
            await pilot.pause()
            await pilot.pause()
            assert table.size.width == WIDTH
            app.export_screenshot()
            colours = [app.screen.get_style_at(x, 0).bgcolor for x in range(WIDTH)]
            assert colours == [header] * WIDTH, "the header's last cells kept the old width's padding"

    run(body())
