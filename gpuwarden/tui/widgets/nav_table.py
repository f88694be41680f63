"""A row-cursor table that moves the way people move in k9s and lazygit: j/k, g/G, home/end."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.events import Resize
from textual.widgets import DataTable


class NavTable(DataTable[str | Text]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("home,g", "first_row", "First", show=False),
        Binding("end,G", "last_row", "Last", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)

    def on_resize(self, event: Resize) -> None:
        # DataTable caches each rendered row under a counter it bumps only when this event comes,
        # not under its width; the screen repaints at the new width before the event arrives, so
        # a row rendered just before kept the old width's padding (a header cell in the screen's
        # background where a scrollbar went away) until something else repainted the table.
        self.refresh()
