"""The command palette (ctrl+p): gpuwarden's own commands only, each worded for what it does to
what is selected now, and only those that would do something (Textual's theme, screenshot and
keys panel are not offered: they are not part of this tool)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from textual.app import App, SystemCommand
from textual.screen import Screen

from gpuwarden.tui.backend import RunRow
from gpuwarden.tui.controls import refusal
from gpuwarden.tui.requests import AskStop, AskSubmit, ChooseMetrics, HistoryWindow, ShowTab
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen

_RUN_ACTIONS = (
    ("stop_run", "Stop {name}", "SIGTERM, a checkpoint, then SIGKILL after the grace (s)"),
    ("resume_run", "Resume {name}", "a new attempt from its last checkpoint (r)"),
    ("edit_run", "Change {name}'s settings", "set knobs, then start it again (e)"),
    ("tune_run", "Tune {name}", "probe for the fastest micro-batch before it goes on (t)"),
    ("rerun_run", "Run {name} again", "a new run from its spec, with knobs changed (R)"),
)


def _run_commands(
    run: RunRow, allowed: Callable[[str], bool], act: Callable[[str], None]
) -> Iterator[SystemCommand]:
    for action, title, help_text in _RUN_ACTIONS:
        if allowed(action):
            yield SystemCommand(
                title.format(name=run.name), f"{run.name} ({run.id}): {help_text}", partial(act, action)
            )


def _stop_commands(app: App[Any], runs: list[RunRow]) -> Iterator[SystemCommand]:
    """From a tab without the runs table: stop any run that runs, by name (the palette is where
    one looks for "stop" without first finding the run)."""
    for run in runs:
        if refusal("stop_run", run) is None:
            title, help_text = _RUN_ACTIONS[0][1:]
            ask = partial(app.post_message, AskStop(run))
            yield SystemCommand(title.format(name=run.name), f"{run.name} ({run.id}): {help_text}", ask)


def _main_commands(app: App[Any], screen: MainScreen, act: Callable[[str], None]) -> Iterator[SystemCommand]:
    """The main screen's own: charts and history, the selected run's or process's controls."""
    if screen.gw.live.gpus:
        yield SystemCommand(
            "Next chart metric", "Chart the next GPU metric (m)", partial(act, "cycle_metric(1)")
        )
    window = f"After {screen.history.window}, the next history window (w)"
    yield SystemCommand("History window", window, partial(app.post_message, HistoryWindow(1)))
    what = "Choose the metrics charted for every GPU and the host (c)"
    yield SystemCommand("History metrics", what, partial(app.post_message, ChooseMetrics()))
    if screen.tab == "runs":
        run = screen.runs.selected()
        if run is not None:
            yield from _run_commands(run, lambda a: screen.check_action(a, ()) is True, act)
        what = "Only runs whose name, id or state has the text (/)"
        yield SystemCommand("Filter runs", what, partial(act, "filter_runs"))
        what = f"After {screen.runs.sort_label}, the next sort order (o)"
        yield SystemCommand("Sort runs", what, partial(act, "sort_runs"))
    elif screen.gw.control_refusal() is None:
        yield from _stop_commands(app, screen.runs.every_run())
    proc = screen.overview.selected_process() if screen.tab == "overview" else None
    if proc is not None and screen.check_action("kill_process", ()) is True:
        what = f"{proc.command[:50]}: SIGTERM, then SIGKILL if it stays (x)"
        yield SystemCommand(f"Terminate process {proc.pid}", what, partial(act, "kill_process"))


def palette_commands(app: App[Any], screen: Screen[Any], controls_refused: bool) -> Iterator[SystemCommand]:
    """What the palette offers on `screen`, in the words of each action; `controls_refused`: no
    control can run now (read-only, or no daemon)."""

    def act(action: str) -> None:
        app.call_later(app.run_action, action, screen)

    def tab(name: str) -> Callable[[], object]:
        return partial(app.post_message, ShowTab(name))

    yield SystemCommand("Overview", "GPU cards, the host and the GPU processes (1)", tab("overview"))
    yield SystemCommand("Runs", "Every run with its state, progress and retunes (2)", tab("runs"))
    yield SystemCommand("History", "Charts of every GPU and the host, 5m … 30d (3)", tab("history"))
    yield SystemCommand("Keys", "Every key and where it works (?)", partial(act, "app.help"))
    yield SystemCommand(
        "Quit", "Leave the dashboard; the daemon and its runs go on (q)", partial(act, "app.quit")
    )
    if isinstance(screen, MainScreen):
        yield from _main_commands(app, screen, act)
    if isinstance(screen, RunDetailScreen):
        yield from _run_commands(screen.summary, lambda a: screen.check_action(a, ()) is True, act)
        yield SystemCommand("Back to the runs", "Close this run's screen (esc)", partial(act, "back"))
    if not controls_refused:
        what = "Queue a run from a spec file, with path completion (n)"
        yield SystemCommand("Submit a run spec", what, partial(app.post_message, AskSubmit()))
