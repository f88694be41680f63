"""The command palette (ctrl+p): gpuwarden's own commands only, each worded for what it does to
what is selected now, and only those that would do something (Textual's theme, screenshot and
keys panel are not offered: they are not part of this tool)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.app import SystemCommand
from textual.screen import Screen

from gpuwarden.tui.backend import RunRow
from gpuwarden.tui.controls import refusal

if TYPE_CHECKING:
    from gpuwarden.tui.app import GpuwardenApp


_RUN_ACTIONS = (
    ("stop_run", "Stop {name}", "SIGTERM, a checkpoint, then SIGKILL after the grace (s)"),
    ("resume_run", "Resume {name}", "a new attempt from its last checkpoint (r)"),
    ("edit_run", "Change {name}'s settings", "set knobs, then start it again (e)"),
    ("tune_run", "Tune {name}", "probe for the fastest micro-batch before it goes on (t)"),
)


def _run_commands(
    run: RunRow, allowed: Callable[[str], bool], act: Callable[[str], None]
) -> Iterator[SystemCommand]:
    for action, title, help_text in _RUN_ACTIONS:
        if allowed(action):
            yield SystemCommand(
                title.format(name=run.name), f"{run.name} ({run.id}): {help_text}", partial(act, action)
            )


def _stop_commands(app: GpuwardenApp, runs: list[RunRow]) -> Iterator[SystemCommand]:
    """From a tab without the runs table: stop any run that runs, by name (the palette is where
    one looks for "stop" without first finding the run)."""
    if app.control_refusal() is not None:
        return
    for run in runs:
        if refusal("stop_run", run) is None:
            title, help_text = _RUN_ACTIONS[0][1:]
            yield SystemCommand(
                title.format(name=run.name), f"{run.name} ({run.id}): {help_text}", partial(app.ask_stop, run)
            )


def palette_commands(app: GpuwardenApp, screen: Screen[Any]) -> Iterator[SystemCommand]:
    """What the palette offers on `screen`, in the words of each action."""
    from gpuwarden.tui.screens.main import MainScreen
    from gpuwarden.tui.screens.run_detail import RunDetailScreen

    def act(action: str) -> None:
        app.call_later(app.run_action, action, screen)

    tab = partial(app.action_show_tab)
    yield SystemCommand("Overview", "GPU cards, the host and the GPU processes (1)", partial(tab, "overview"))
    yield SystemCommand("Runs", "Every run with its state, progress and retunes (2)", partial(tab, "runs"))
    yield SystemCommand("History", "Charts of every GPU and the host, 5m … 30d (3)", partial(tab, "history"))
    yield SystemCommand("Keys", "Every key and where it works (?)", app.action_help)
    yield SystemCommand("Quit", "Leave the dashboard; the daemon and its runs go on (q)", app.action_quit)
    if isinstance(screen, MainScreen):
        if app.live.gpus:
            yield SystemCommand(
                "Next chart metric", "Chart the next GPU metric (m)", partial(act, "cycle_metric(1)")
            )
        window = f"After {screen.history.window}, the next history window (w)"
        yield SystemCommand("History window", window, partial(app.history_window, 1))
        what = "Choose the metrics charted for every GPU and the host (c)"
        yield SystemCommand("History metrics", what, app.choose_metrics)
        if screen.tab == "runs":
            run = screen.runs.selected()
            if run is not None:
                yield from _run_commands(run, lambda a: screen.check_action(a, ()) is True, act)
            what = "Only runs whose name, id or state has the text (/)"
            yield SystemCommand("Filter runs", what, partial(act, "filter_runs"))
            what = f"After {screen.runs.sort_label}, the next sort order (o)"
            yield SystemCommand("Sort runs", what, partial(act, "sort_runs"))
        else:
            yield from _stop_commands(app, screen.runs.every_run())
        proc = screen.overview.selected_process() if screen.tab == "overview" else None
        if proc is not None and screen.check_action("kill_process", ()) is True:
            what = f"{proc.command[:50]}: SIGTERM, then SIGKILL if it stays (x)"
            yield SystemCommand(f"Terminate process {proc.pid}", what, partial(act, "kill_process"))
    if isinstance(screen, RunDetailScreen):
        yield from _run_commands(screen.summary, lambda a: screen.check_action(a, ()) is True, act)
        yield SystemCommand("Back to the runs", "Close this run's screen (esc)", partial(act, "back"))
    if app.control_refusal() is None:
        what = "Queue a run from a spec file, with path completion (n)"
        yield SystemCommand("Submit a run spec", what, app.action_submit)
