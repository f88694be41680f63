"""The main screen: a status line, three tabs (overview, runs, history) and the key footer.

The footer shows only the keys that do something here and now: a run's controls as its state
allows, the process key when a process of yours is selected, the metric key when there are
GPUs. A key pressed for something not offered says why in one line instead of doing nothing.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane, Tabs

from gpuwarden.tui.backend import HostsSource
from gpuwarden.tui.controls import CONTROL_KEYS, RUN_CONTROLS, refusal, rerun_in_footer
from gpuwarden.tui.dashboard import Dashboard
from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.metrics import CHART_METRICS, HOST_CHART_METRICS
from gpuwarden.tui.requests import (
    AskEdit,
    AskKill,
    AskRerun,
    AskResume,
    AskStop,
    AskSubmit,
    AskTune,
    CycleOverviewMetric,
    MainShown,
    OpenRun,
    ShowTab,
)
from gpuwarden.tui.screens.dialogs import MetricsScreen
from gpuwarden.tui.screens.history import HistoryPane
from gpuwarden.tui.screens.hosts import HostsPane
from gpuwarden.tui.screens.overview import OverviewPane
from gpuwarden.tui.screens.runs import RunsPane
from gpuwarden.tui.widgets.nav_table import NavTable
from gpuwarden.tui.widgets.status_bar import StatusBar

TABS = ("overview", "runs", "history")
# Which tab each screen-level action belongs to; the footer shows an action only on its tab.
_ACTION_TAB = {
    "kill_process": ("overview",),
    "stop_run": ("runs",),
    "resume_run": ("runs",),
    "edit_run": ("runs",),
    "tune_run": ("runs",),
    "rerun_run": ("runs",),
    "cycle_metric": ("overview", "history"),
    "choose_metrics": ("history",),
}
_KEY_ACTION = {key: action for action, key in CONTROL_KEYS.items()} | {
    "m": "cycle_metric",
    "M": "cycle_metric",
}


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "cycle_metric(1)", "Metric"),
        Binding("M", "cycle_metric(-1)", show=False),
        Binding("c", "choose_metrics", "Metrics"),
        Binding("x", "kill_process", "Terminate"),
        Binding("s", "stop_run", "Stop"),
        Binding("r", "resume_run", "Resume"),
        Binding("e", "edit_run", "Edit", priority=True),  # before the keys after it: see hold_keys
        Binding("t", "tune_run", "Tune"),
        # Priority: it opens a dialog, as `e` does. Shown for a run with nothing else to offer
        # (see `rerun_in_footer`), unshown otherwise.
        Binding("R", "rerun_run(1)", "Again", priority=True),
        Binding("R", "rerun_run(0)", show=False, priority=True),
        # The main screen's only (a run's screen keeps its footer to the run's own keys). Priority:
        # the dialog opens as `n` is read, before the keys typed after it (see `hold_keys`).
        Binding("n", "submit", "Submit", priority=True),
        Binding("4", "show_hosts", "Hosts", show=False),
    ]
    DEFAULT_CSS = """
    MainScreen.-offline #tabs { text-opacity: 55%; }
    """

    def __init__(self, app: Dashboard) -> None:
        super().__init__()
        self.gw = app
        # Built once: the footer asks check_action often, and a DOM query each time is not free.
        # Several hosts (`tui --host …`): a fourth tab with every host's GPUs, shown first.
        fleet = app.backend if isinstance(app.backend, HostsSource) else None
        self._hosts = HostsPane(fleet, id="hosts-pane") if fleet is not None else None
        self._tabs = TabbedContent(initial="hosts" if self._hosts else "overview", id="tabs")
        self._overview = OverviewPane(readonly=app.readonly, id="overview-pane")
        self._runs = RunsPane(readonly=app.readonly, id="runs-pane")
        self._history = HistoryPane(app.backend, app.clock, id="history-pane")

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with self._tabs:
            with TabPane("1 Overview", id="overview"):
                yield self._overview
            with TabPane("2 Runs", id="runs"):
                yield self._runs
            with TabPane("3 History", id="history"):
                yield self._history
            if self._hosts is not None:
                with TabPane("4 Hosts", id="hosts"):
                    yield self._hosts
        yield Footer(compact=True)  # at 80 columns the most keys offered at once fit only so

    def on_mount(self) -> None:
        # Tabs change with 1/2/3; a focused tab strip would swallow ← → meant for the history cursor.
        self.query_one(Tabs).can_focus = False
        self.query_one("#hosts-table" if self._hosts else "#processes", NavTable).focus()
        self.ask(MainShown())

    @property
    def tab(self) -> str:
        """The tab shown ("overview" while the screen is still being built)."""
        return (self._tabs.active if self._tabs.is_mounted else "") or "overview"

    @property
    def overview(self) -> OverviewPane:
        return self._overview

    @property
    def runs(self) -> RunsPane:
        return self._runs

    @property
    def history(self) -> HistoryPane:
        return self._history

    def show_tab(self, tab: str) -> None:
        self._tabs.active = tab
        focus = {
            "overview": "#processes",
            "runs": "#runs-table",
            "history": "#history-pane",
            "hosts": "#hosts-table",
        }[tab]
        # The pane becomes visible on the next refresh; a hidden widget cannot take focus.
        self.call_after_refresh(self.query_one(focus).focus)
        if tab == "history" and self.history.needs_reload:
            self.history.reload()
        self.refresh_bindings()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()

    def on_runs_pane_open_run(self, message: RunsPane.OpenRun) -> None:
        self.ask(OpenRun(message.run_id))

    def on_runs_pane_highlighted(self, message: RunsPane.Highlighted) -> None:
        self.refresh_bindings()

    def on_overview_pane_process_highlighted(self, message: OverviewPane.ProcessHighlighted) -> None:
        self.refresh_bindings()

    # -- what is offered ----------------------------------------------------------------------

    def refusal(self, action: str) -> str | None:
        """Why `action` does nothing here and now (None: it is offered, or it is not this tab's)."""
        tabs = _ACTION_TAB.get(action)
        if tabs is not None and self.tab not in tabs:
            return None
        if action in CONTROL_ACTIONS and (why := self.gw.control_refusal()):
            return why
        if not (self._runs.is_mounted and self._overview.is_mounted):
            return None  # still being built
        if action in RUN_CONTROLS:
            run = self.runs.selected()
            return "no run selected" if run is None else refusal(action, run)
        if action == "kill_process":
            return self.overview.kill_refusal()
        if action == "cycle_metric" and self.tab == "overview" and not self.gw.live.gpus:
            return "no GPU to chart: the host's CPU and memory are in the history tab (3)"
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if not self.is_mounted:
            return True
        tabs = _ACTION_TAB.get(action)
        if tabs is not None and self.tab not in tabs:
            return False
        if self.refusal(action) is not None:
            return False
        if action == "rerun_run" and parameters and self._runs.is_mounted:
            run = self.runs.selected()  # one of its two bindings is shown, the other not
            return run is not None and bool(parameters[0]) == rerun_in_footer(run)
        return True

    def on_key(self, event: events.Key) -> None:
        """A key whose action is not offered now says why (it reaches here only then)."""
        action = _KEY_ACTION.get(event.key)
        why = self.refusal(action) if action else None
        if why:
            event.stop()
            self.notify(why, timeout=4)

    # -- actions ------------------------------------------------------------------------------

    def ask(self, request: Message) -> None:
        """Hand a request to the app (it opens dialogs, runs controls and switches tabs)."""
        self.app.post_message(request)

    def action_show_hosts(self) -> None:
        if self._hosts is not None:
            self.ask(ShowTab("hosts"))

    def action_cycle_metric(self, step: int) -> None:
        if self.tab == "history":
            self.history.cycle_metric(step)
        else:
            self.ask(CycleOverviewMetric(step))

    def action_choose_metrics(self) -> None:
        pane = self.history

        def answered(chosen: list[str] | None) -> None:
            if chosen:
                self.call_later(pane.set_metrics, chosen)

        gpu = [(m.key, m.label) for m in CHART_METRICS] if self.gw.live.gpus else []
        host = [(f"host.{m.key}", f"host {m.label}") for m in HOST_CHART_METRICS]
        chosen = [*pane.metrics, *(f"host.{k}" for k in pane.host_metrics)]
        self.app.push_screen(MetricsScreen(gpu + host, chosen), answered)

    def action_submit(self) -> None:
        self.ask(AskSubmit())

    def action_kill_process(self) -> None:
        proc = self.overview.selected_process()
        if proc is not None:
            self.ask(AskKill(proc))

    def action_stop_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.ask(AskStop(run))

    def action_resume_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.ask(AskResume(run))

    def action_edit_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.ask(AskEdit(run))

    def action_tune_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.ask(AskTune(run))

    def action_rerun_run(self, shown: int = 1) -> None:
        """`shown`: which of R's two bindings ran (the footer's or the unshown one); both ask."""
        run = self.runs.selected()
        if run is not None:
            self.ask(AskRerun(run))
