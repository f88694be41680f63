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
from gpuwarden.tui.screens.runs import FIXED, MEANINGS, WITH_HOST


def help_table(readonly: bool, hosts: bool = False) -> Table:
    table = Table(box=None, expand=True, padding=(0, 1), show_edge=False)
    table.add_column("Key", style="bold cyan", no_wrap=True)
    table.add_column("Action")
    table.add_column("Where", style="dim", no_wrap=True)
    for a in ACTIONS:
        if (readonly and a.control) or (a.hosts and not hosts):
            continue
        table.add_row(a.key, a.description, a.where)
    return table


def columns_table(hosts: bool = False) -> Table:
    """The runs table's short headers, each with what it holds."""
    table = Table(box=None, expand=True, padding=(0, 1), show_edge=False)
    table.add_column("Column", style="bold cyan", no_wrap=True)
    table.add_column("What it holds")
    for key, label, _ in WITH_HOST if hosts else FIXED:
        table.add_row(label, MEANINGS[key])
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", show=False),
        Binding("q", "close", show=False),
        # The keys the help lists for moving, so a list taller than 80×24 scrolls with them.
        Binding("j", "scroll('down')", show=False),
        Binding("k", "scroll('up')", show=False),
        Binding("g", "scroll('home')", show=False),
        Binding("G", "scroll('end')", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    /* Taller than 80×24: kept off the top line, which says when the daemon cannot write its store. */
    HelpScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 100%; margin-top: 1;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen .title { text-style: bold; }
    HelpScreen .section { margin-top: 1; }
    """

    def __init__(self, readonly: bool, hosts: bool = False) -> None:
        super().__init__()
        self.readonly = readonly
        self.hosts = hosts

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            title = "Keys" + (" (read-only: no controls)" if self.readonly else "") + " — esc closes"
            yield Static(title, classes="title")
            yield Static(help_table(self.readonly, self.hosts))
            yield Static("The runs table's columns", classes="title section")
            yield Static(columns_table(self.hosts))

    def action_scroll(self, where: str) -> None:
        scroll = self.query_one(VerticalScroll)
        if where in ("down", "up"):
            (scroll.scroll_down if where == "down" else scroll.scroll_up)(animate=False)
        else:
            (scroll.scroll_home if where == "home" else scroll.scroll_end)(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
