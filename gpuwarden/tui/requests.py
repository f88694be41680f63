"""What screens, panes and the command palette ask the app for. They post these instead of
calling the app, so nothing below the app imports it; the app hands each to the part that does it
(run controls, navigation, the stream).

A request that opens a dialog is an `OpensDialog`: the app starts keeping the keys read from the
moment it is posted, so what is typed right after the key that asked for it reaches the dialog
(see `KeyHold`)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from gpuwarden.tui.backend import ProcessInfo, RunDetailView, RunRow


class OpensDialog(Message, bubble=False):
    """A request whose answer is a dialog."""


class MainShown(Message, bubble=False):
    """The main screen is mounted: the status lines can be drawn and the stream started."""


@dataclass
class OpenRun(Message, bubble=False):
    run_id: str


@dataclass
class ShowTab(Message, bubble=False):
    tab: str


@dataclass
class CycleOverviewMetric(Message, bubble=False):
    step: int


@dataclass
class HistoryWindow(Message, bubble=False):
    """Show the history tab with the next (step 1) or previous (-1) window."""

    step: int


class ChooseMetrics(Message, bubble=False):
    """Show the history tab with its metric chooser open."""


@dataclass
class AskStop(Message, bubble=False):
    run: RunRow


@dataclass
class AskResume(Message, bubble=False):
    run: RunRow


@dataclass
class AskTune(Message, bubble=False):
    run: RunRow


@dataclass
class AskKill(Message, bubble=False):
    proc: ProcessInfo


@dataclass
class AskEdit(OpensDialog, bubble=False):
    """The knob dialog for a run that starts again; `detail`: the run as read, if at hand."""

    run: RunRow
    detail: RunDetailView | None = None


@dataclass
class AskRerun(OpensDialog, bubble=False):
    """The knob dialog for a new run from a finished run's spec."""

    run: RunRow
    detail: RunDetailView | None = None


class AskSubmit(OpensDialog, bubble=False):
    """The submit dialog (a spec file's path)."""
