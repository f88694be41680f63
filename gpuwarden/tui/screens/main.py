"""The main screen: a status line, three tabs (overview, runs, history) and the key footer."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, TabbedContent, TabPane, Tabs

from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.metrics import CHART_METRICS
from gpuwarden.tui.screens.dialogs import MetricsScreen
from gpuwarden.tui.screens.history import HistoryPane
from gpuwarden.tui.screens.overview import OverviewPane
from gpuwarden.tui.screens.runs import RunsPane
from gpuwarden.tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from gpuwarden.tui.app import GpuwardenApp

TABS = ("overview", "runs", "history")
# Which tab each screen-level action belongs to; the footer shows an action only on its tab.
_ACTION_TAB = {
    "kill_process": ("overview",),
    "stop_run": ("runs",),
    "resume_run": ("runs",),
    "edit_run": ("runs",),
    "tune_run": ("runs",),
    "cycle_metric": ("overview", "history"),
    "choose_metrics": ("history",),
}


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "cycle_metric(1)", "Metric"),
        Binding("M", "cycle_metric(-1)", show=False),
        Binding("c", "choose_metrics", "Metrics"),
        Binding("k", "kill_process", "Kill proc"),
        Binding("s", "stop_run", "Stop"),
        Binding("r", "resume_run", "Resume"),
        Binding("e", "edit_run", "Edit"),
        Binding("t", "tune_run", "Tune"),
    ]

    def __init__(self, app: GpuwardenApp) -> None:
        super().__init__()
        self.gw = app

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("1 Overview", id="overview"):
                yield OverviewPane(id="overview-pane")
            with TabPane("2 Runs", id="runs"):
                yield RunsPane(readonly=self.gw.readonly, id="runs-pane")
            with TabPane("3 History", id="history"):
                yield HistoryPane(self.gw.backend, self.gw.clock, id="history-pane")
        yield Footer()

    def on_mount(self) -> None:
        # Tabs change with 1/2/3; a focused tab strip would swallow ← → meant for the history cursor.
        self.query_one(Tabs).can_focus = False
        self.query_one("#processes", DataTable).focus()
        self.gw.show_status()
        self.call_after_refresh(self.gw.connect)

    @property
    def tab(self) -> str:
        return self.query_one("#tabs", TabbedContent).active or "overview"

    @property
    def overview(self) -> OverviewPane:
        return self.query_one(OverviewPane)

    @property
    def runs(self) -> RunsPane:
        return self.query_one(RunsPane)

    @property
    def history(self) -> HistoryPane:
        return self.query_one(HistoryPane)

    def show_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab
        focus = {"overview": "#processes", "runs": "#runs-table", "history": "#history-pane"}[tab]
        # The pane becomes visible on the next refresh; a hidden widget cannot take focus.
        self.call_after_refresh(self.query_one(focus).focus)
        if tab == "history" and self.history.loaded != self.history.wanted:
            self.history.reload()
        self.refresh_bindings()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()

    def on_runs_pane_open_run(self, message: RunsPane.OpenRun) -> None:
        self.gw.open_run(message.run_id)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS and self.gw.readonly:
            return False
        tabs = _ACTION_TAB.get(action)
        return tabs is None or not self.is_mounted or self.tab in tabs

    def action_cycle_metric(self, step: int) -> None:
        if self.tab == "history":
            self.history.cycle_metric(step)
        else:
            self.gw.cycle_overview_metric(step)

    def action_choose_metrics(self) -> None:
        pane = self.history

        def answered(chosen: list[str] | None) -> None:
            if chosen:
                self.call_later(pane.set_metrics, chosen)

        choices = [(m.key, m.label) for m in CHART_METRICS]
        self.app.push_screen(MetricsScreen(choices, list(pane.metrics)), answered)

    def action_kill_process(self) -> None:
        proc = self.overview.selected_process()
        if proc is not None:
            self.gw.ask_kill(proc)

    def action_stop_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.gw.ask_stop(run)

    def action_resume_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.gw.ask_resume(run)

    def action_edit_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.gw.ask_edit(run, None)

    def action_tune_run(self) -> None:
        run = self.runs.selected()
        if run is not None:
            self.gw.ask_tune(run)
