"""Modal dialogs: confirm a control, submit a spec path (with completion), change a knob, choose
the history charts' metrics."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.suggester import Suggester
from textual.widgets import Input, Label, OptionList, SelectionList, Static
from textual.widgets.option_list import OptionDoesNotExist
from textual.widgets.selection_list import Selection
from textual.worker import Worker, WorkerState

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
    """Completes the last path component inline with the first candidate (→ accepts it)."""

    def __init__(self, cwd: Path | None = None) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self.cwd = cwd

    async def get_suggestion(self, value: str) -> str | None:
        return complete_path(value, self.cwd)


def path_candidates(value: str, cwd: Path | None = None, limit: int = 200) -> list[str]:
    """Every completion of `value` (as typed, `~` kept): directories first, with a slash, then
    YAML files; hidden entries only when the typed name starts with a dot."""
    head, sep, stem = value.rpartition("/")
    directory = Path(os.path.expanduser(head + sep)) if sep else Path(".")
    if not directory.is_absolute() and cwd is not None:
        directory = cwd / directory
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []
    prefix = value[: len(value) - len(stem)]
    shown = [
        e for e in entries if e.name.startswith(stem) and (stem.startswith(".") or not e.name.startswith("."))
    ]
    dirs = [e.name + "/" for e in shown if e.is_dir()]
    specs = [e.name for e in shown if not e.is_dir() and e.name.endswith((".yaml", ".yml"))]
    return [prefix + name for name in dirs + specs if name != stem][:limit]


def complete_path(value: str, cwd: Path | None = None) -> str | None:
    """The first completion of `value`, or None."""
    if not value:
        return None
    found = path_candidates(value, cwd, limit=1)
    return found[0] if found else None


class SubmitScreen(ModalScreen[str | None]):
    """Ask for a spec path with its completions listed; the dialog stays open, with what was
    typed, until the daemon accepts the spec (its refusal is shown here)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("tab", "accept", "Complete", priority=True),
        Binding("down", "move(1)", show=False, priority=True),
        Binding("up", "move(-1)", show=False, priority=True),
        Binding("ctrl+t", "next_host", "Next host", priority=True),
    ]
    DEFAULT_CSS = (
        _DIALOG_CSS.format(name="SubmitScreen")
        + """
    SubmitScreen OptionList { height: auto; max-height: 8; border: none; padding: 0; }
    SubmitScreen #submit-host { height: 1; }
    """
    )

    def __init__(
        self,
        cwd: Path | None = None,
        submit: Callable[[str], str] | None = None,
        hosts: Sequence[str] = (),
        submit_to: Callable[[str, str], str] | None = None,
    ) -> None:
        super().__init__()
        self.cwd = cwd
        self.submit = submit  # None: the dialog only answers the path (the caller submits)
        # Several hosts: the spec goes to the one chosen here (ctrl+t), through `submit_to`.
        self.hosts = list(hosts)
        self.host = self.hosts[0] if self.hosts else None
        if submit_to is not None and self.host is not None:
            self.submit = lambda path: submit_to(self.host or "", path)
        self._listed_for: str | None = None  # the typed value the candidates were listed for

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Submit a run spec", classes="title")
            if self.hosts:
                yield Static(self._host_line(), id="submit-host")
            yield Input(placeholder="path/to/spec.yaml", suggester=PathSuggester(self.cwd), id="spec-path")
            yield OptionList(id="candidates")
            yield Label("↑↓ choose  tab completes  enter submits a file  esc cancels", classes="hint")
            yield Static(classes="error", id="submit-error")

    def on_mount(self) -> None:
        self.show_candidates("")

    @property
    def candidates(self) -> OptionList:
        return self.query_one("#candidates", OptionList)

    def show_candidates(self, value: str) -> None:
        self._listed_for = value
        found = path_candidates(value or "", self.cwd)
        options = self.candidates
        options.clear_options()
        options.add_options(found)
        options.display = bool(found)
        options.highlighted = 0 if found else None

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#submit-error", Static).update("")
        if event.input.value != self._listed_for:  # a late message keeps the list (and the choice)
            self.show_candidates(event.input.value)

    def action_move(self, step: int) -> None:
        options = self.candidates
        if options.option_count:
            current = options.highlighted if options.highlighted is not None else -1
            options.highlighted = (current + step) % options.option_count

    def highlighted(self) -> str | None:
        # A key can arrive before the Changed message of the keystroke before it (tab right after
        # typing, a paste): list for what the field holds now, not for what it held.
        typed = self.query_one("#spec-path", Input).value
        if typed != self._listed_for:
            self.show_candidates(typed)
        options = self.candidates
        if options.highlighted is None or not options.option_count:
            return None
        return str(options.get_option_at_index(options.highlighted).prompt)

    def action_accept(self) -> None:
        choice = self.highlighted()
        if choice is not None:
            field = self.query_one("#spec-path", Input)
            field.value = choice
            field.cursor_position = len(choice)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_accept()
        self.query_one("#spec-path", Input).focus()

    def _path(self, value: str) -> Path:
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() or self.cwd is None else self.cwd / path

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if not value:
            self.query_one("#submit-error", Static).update("Type the path of a spec file.")
            return
        if not self._path(value).is_file() and self.highlighted() is not None:
            self.action_accept()  # enter on a partial path completes it
            return
        if self.submit is None:
            self.dismiss(str(self._path(value)))
            return
        self.query_one("#submit-error", Static).update("submitting …")
        self.run_worker(partial(self.submit, str(self._path(value))), thread=True, exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        _dialog_worker(self, event, "#submit-error")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _host_line(self) -> str:
        return f"on host {self.host}   (ctrl+t: the next of {', '.join(self.hosts)})"

    def action_next_host(self) -> None:
        if len(self.hosts) > 1 and self.host is not None:
            self.host = self.hosts[(self.hosts.index(self.host) + 1) % len(self.hosts)]
            self.query_one("#submit-host", Static).update(self._host_line())


def _dialog_worker(screen: ModalScreen[Any], event: Worker.StateChanged, error_id: str) -> None:
    """A dialog's action ended: close with its result, or keep the dialog and say what was wrong."""
    event.stop()
    if event.state == WorkerState.SUCCESS:
        screen.dismiss(event.worker.result)
    elif event.state == WorkerState.ERROR:
        error = event.worker.error
        known = isinstance(error, UserError | ValueError)
        text = str(error) if known else f"{type(error).__name__}: {error}"
        screen.query_one(error_id, Static).update(text)


def parse_knob(text: str) -> dict[str, Any]:
    """`batch_size=4, precision=fp16` → {"batch_size": 4, "precision": "fp16"}; values are read as
    YAML scalars so numbers and booleans keep their types."""
    changes: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, raw = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"'{part.strip()}': write name=value, e.g. batch_size=4")
        if key.strip() in changes:
            raise ValueError(f"{key.strip()} is given twice: give each knob once")
        try:
            changes[key.strip()] = load_yaml_value(raw.strip(), key.strip()) if raw.strip() else None
        except UserError:
            hint = "write a number, a word or true/false"
            raise ValueError(f"'{raw.strip()[:60]}' is not a value: {hint}") from None
    if not changes:
        raise ValueError("nothing to change: write name=value, e.g. batch_size=4")
    return changes


def _example(knobs: dict[str, Any]) -> str:
    """A placeholder a person could type as is: the first knob at double (or its own) value."""
    for name, value in knobs.items():
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{name}={value * 2}"
    return f"{next(iter(knobs))}=…" if knobs else "name=value"


class KnobScreen(ModalScreen[dict[str, Any] | None]):
    """Change knobs of a run and start it again (`again`: submit a new run from its spec with
    them instead). `apply` asks the daemon (in a thread); the dialog closes only when it agrees,
    and keeps the input with the refusal otherwise."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = _DIALOG_CSS.format(name="KnobScreen")

    def __init__(
        self,
        run_name: str,
        knobs: dict[str, Any],
        apply: Callable[[dict[str, Any]], None] | None = None,
        *,
        again: bool = False,
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.again = again
        self.knobs = knobs
        self.apply = apply
        self._changes: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.again:
                yield Label(f"Run {self.run_name} again as a new run, with changes", classes="title")
            else:
                yield Label(f"Change {self.run_name}'s settings and start it again", classes="title")
            now = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
            if self.again:  # its knobs as they were, to edit in place
                kept = "its knobs as it ran" if now else "no knobs declared (a dotted key changes its spec)"
                yield Static(f"{kept}; the rest of its spec is kept", classes="hint")
                yield Input(now, placeholder=_example(self.knobs), id="knob")
            else:
                yield Static(f"now: {now}" if now else "this run declares no knobs", classes="hint")
                yield Input(placeholder=_example(self.knobs), id="knob")
            enter = "enter submits" if self.again else "enter applies"
            yield Label(f"name=value, …   {enter}   esc cancels", classes="hint")
            yield Static(classes="error", id="knob-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            # Run again with nothing typed: as it ran (an edit with nothing typed changes nothing).
            changes = {} if self.again and not event.value.strip() else parse_knob(event.value)
        except ValueError as exc:
            self.query_one("#knob-error", Static).update(str(exc))
            return
        if self.apply is None:
            self.dismiss(changes)
            return
        self._changes = changes
        self.query_one("#knob-error", Static).update("applying …")
        self.run_worker(partial(self._apply, changes), thread=True, exit_on_error=False)

    def _apply(self, changes: dict[str, Any]) -> dict[str, Any]:
        assert self.apply is not None
        self.apply(changes)
        return changes

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        _dialog_worker(self, event, "#knob-error")

    def action_cancel(self) -> None:
        self.dismiss(None)


class TickList(SelectionList[str]):
    """A selection list whose unticked boxes are empty: Textual draws the same X in every box
    and tells them apart by colour alone, which a monochrome terminal or a colour-blind person
    does not see."""

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        segments = list(strip)
        try:
            ticked = self.get_option_at_index(self.scroll_offset.y + y).value in self.selected
        except OptionDoesNotExist:  # a line below the last choice
            return strip
        if ticked or len(segments) < 2:
            return strip
        segments[1] = segments[1]._replace(text=" " * len(segments[1].text))
        return Strip(segments, strip.cell_length)


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
    /* Unticked: an empty box (the X drawn in the box's own colour); ticked: a bold green X. */
    MetricsScreen SelectionList > .selection-list--button { color: $panel; }
    MetricsScreen SelectionList > .selection-list--button-selected { color: $success; text-style: bold; }
    MetricsScreen SelectionList > .selection-list--button-highlighted { color: $panel; }
    MetricsScreen SelectionList > .selection-list--button-selected-highlighted {
        color: $success; text-style: bold;
    }
    """
    )

    def __init__(self, choices: list[tuple[str, str]], chosen: list[str]) -> None:
        super().__init__()
        self.choices = choices  # (key, label) in display order
        self.chosen = chosen

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("History: what to chart", classes="title")
            yield Label("GPU metrics are charted for every GPU, host metrics once", classes="hint")
            yield TickList(
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
