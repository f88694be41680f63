"""The help screen: every key, where it works, from the one table in `keys.py`."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuwarden.tui.keys import ACTIONS


def help_table(readonly: bool) -> Table:
    table = Table(box=None, expand=True, padding=(0, 1), show_edge=False)
    table.add_column("Key", style="bold cyan", no_wrap=True)
    table.add_column("Action")
    table.add_column("Where", style="dim", no_wrap=True)
    for a in ACTIONS:
        if readonly and a.control:
            continue
        table.add_row(a.key, a.description, a.where)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", show=False),
        Binding("q", "close", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen .title { text-style: bold; }
    """

    def __init__(self, readonly: bool) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            title = "Keys" + (" (read-only: no controls)" if self.readonly else "") + " — esc closes"
            yield Static(title, classes="title")
            yield Static(help_table(self.readonly))

    def action_close(self) -> None:
        self.dismiss(None)
