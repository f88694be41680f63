"""Modal dialogs: confirm a control, submit a spec path (with completion), change a knob, choose
the history charts' metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Input, Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import load_yaml_value

_DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 72; max-width: 100%; height: auto;
    border: round $accent; background: $surface; padding: 0 1;
}}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
{name} .hint {{ color: $text-muted; }}
{name} .error {{ color: $error; height: auto; }}
"""


class ConfirmScreen(ModalScreen[bool]):
    """y confirms, n or escape cancels: nothing happens without an explicit yes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]
    DEFAULT_CSS = _DIALOG_CSS.format(name="ConfirmScreen")

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, classes="title")
            if self.detail:
                yield Static(self.detail)
            yield Label("y: yes   n / esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PathSuggester(Suggester):
    """Completes the last path component: directories first (with a slash), then YAML files."""

    def __init__(self, cwd: Path | None = None) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self.cwd = cwd

    async def get_suggestion(self, value: str) -> str | None:
        return complete_path(value, self.cwd)


def complete_path(value: str, cwd: Path | None = None) -> str | None:
    """The first completion of `value` (as typed, `~` kept), or None."""
    if not value:
        return None
    head, sep, stem = value.rpartition("/")
    directory = Path(os.path.expanduser(head + sep)) if sep else Path(".")
    if not directory.is_absolute() and cwd is not None:
        directory = cwd / directory
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return None
    prefix = value[: len(value) - len(stem)]
    dirs = [
        e.name + "/" for e in entries if e.name.startswith(stem) and e.is_dir() and not e.name.startswith(".")
    ]
    specs = [e.name for e in entries if e.name.startswith(stem) and e.name.endswith((".yaml", ".yml"))]
    for name in dirs + specs:
        if name != stem:
            return prefix + name
    return None


class SubmitScreen(ModalScreen[str | None]):
    """Ask for a spec path; → accepts the completion, enter submits."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = _DIALOG_CSS.format(name="SubmitScreen")

    def __init__(self, cwd: Path | None = None) -> None:
        super().__init__()
        self.cwd = cwd

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Submit a run spec", classes="title")
            yield Input(placeholder="path/to/spec.yaml", suggester=PathSuggester(self.cwd), id="spec-path")
            yield Label("→ completes   enter submits   esc cancels", classes="hint")
            yield Static(classes="error", id="submit-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if not value:
            self.query_one("#submit-error", Static).update("Type the path of a spec file.")
            return
        path = Path(os.path.expanduser(value))
        if not path.is_absolute() and self.cwd is not None:
            path = self.cwd / path
        self.dismiss(str(path))

    def action_cancel(self) -> None:
        self.dismiss(None)


def parse_knob(text: str) -> dict[str, Any]:
    """`train.batch_size=4, precision=fp16` → {"train.batch_size": 4, "precision": "fp16"};
    values are read as YAML scalars so numbers and booleans keep their types."""
    changes: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"'{part.strip()}': write key=value, e.g. train.batch_size=4")
        try:
            changes[key.strip()] = load_yaml_value(raw.strip(), key.strip()) if raw.strip() else None
        except UserError:
            hint = "write a number, a word or true/false"
            raise ValueError(f"'{raw.strip()[:60]}' is not a value: {hint}") from None
    if not changes:
        raise ValueError("nothing to change: write key=value, e.g. train.batch_size=4")
    return changes


class KnobScreen(ModalScreen[dict[str, Any] | None]):
    """Change knobs of a run's spec and restart it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = _DIALOG_CSS.format(name="KnobScreen")

    def __init__(self, run_name: str, current: str = "") -> None:
        super().__init__()
        self.run_name = run_name
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Change and restart {self.run_name}", classes="title")
            if self.current:
                yield Static(self.current, classes="hint")
            yield Input(placeholder="train.batch_size=4, train.grad_accum=8", id="knob")
            yield Label("enter restarts with these values   esc cancels", classes="hint")
            yield Static(classes="error", id="knob-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            changes = parse_knob(event.value)
        except ValueError as exc:
            self.query_one("#knob-error", Static).update(str(exc))
            return
        self.dismiss(changes)

    def action_cancel(self) -> None:
        self.dismiss(None)


class MetricsScreen(ModalScreen[list[str] | None]):
    """Tick the metrics the history tab charts for every GPU (space ticks, enter applies)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # Enter would otherwise tick the highlighted line: here it applies the choice.
        Binding("enter", "apply", "Apply", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]
    DEFAULT_CSS = (
        _DIALOG_CSS.format(name="MetricsScreen")
        + """
    MetricsScreen SelectionList { height: auto; max-height: 12; border: none; padding: 0; }
    """
    )

    def __init__(self, choices: list[tuple[str, str]], chosen: list[str]) -> None:
        super().__init__()
        self.choices = choices  # (key, label) in display order
        self.chosen = chosen

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("History: metrics to chart for every GPU", classes="title")
            yield SelectionList[str](
                *(Selection(label, key, key in self.chosen) for key, label in self.choices), id="metrics"
            )
            yield Label("space ticks   enter applies   esc cancels", classes="hint")
            yield Static(classes="error", id="metrics-error")

    def action_apply(self) -> None:
        picked = self.query_one("#metrics", SelectionList).selected
        if not picked:
            self.query_one("#metrics-error", Static).update("Tick at least one metric.")
            return
        # The order of the list, not the order of ticking: charts stack the same way each time.
        order = [key for key, _ in self.choices]
        self.dismiss(sorted((str(k) for k in picked), key=order.index))

    def action_cancel(self) -> None:
        self.dismiss(None)
