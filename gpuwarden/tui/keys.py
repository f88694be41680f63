"""Every action of the dashboard in one table: the help screen and the command palette read it,
so a key binding cannot exist without being listed (a test checks the bindings against it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeyAction:
    key: str  # as shown to the user
    action: str  # the Textual action name (without "action_")
    description: str
    where: str  # "everywhere", "runs", "run detail", "overview", "history"
    control: bool = False  # changes something: absent with --readonly


ACTIONS: tuple[KeyAction, ...] = (
    KeyAction("1", "show_tab('overview')", "Overview: GPU cards, host, processes", "everywhere"),
    KeyAction("2", "show_tab('runs')", "Runs table", "everywhere"),
    KeyAction("3", "show_tab('history')", "History charts", "everywhere"),
    KeyAction("m / M", "cycle_metric", "Next / previous chart metric", "overview, history"),
    KeyAction("?", "help", "This help", "everywhere"),
    KeyAction("ctrl+p", "command_palette", "Command palette", "everywhere"),
    KeyAction("q", "quit", "Quit", "everywhere"),
    KeyAction("n", "submit", "Submit a run spec (path with completion)", "everywhere", control=True),
    KeyAction(
        "k", "kill_process", "Terminate the selected GPU process (yours only)", "overview", control=True
    ),
    KeyAction("enter", "open_run", "Open the selected run", "runs"),
    KeyAction("s", "stop_run", "Stop the run (asks first)", "runs, run detail", control=True),
    KeyAction("r", "resume_run", "Resume a stopped or failed run", "runs, run detail", control=True),
    KeyAction("e", "edit_run", "Change a knob and restart", "runs, run detail", control=True),
    KeyAction("t", "tune_run", "Tune: search better settings", "runs, run detail", control=True),
    KeyAction("c", "choose_metrics", "Choose the metrics charted for every GPU", "history"),
    KeyAction("w / W", "cycle_window", "Next / previous window (5m 1h 24h 7d 30d)", "history"),
    KeyAction("← / →", "cursor", "Move the cursor (value and time below the chart)", "history"),
    KeyAction("home / end", "cursor_edge", "Cursor to the oldest / newest point", "history"),
    KeyAction("a / c / l / d", "detail_tab", "Timeline / charts / log / doctor tab", "run detail"),
    KeyAction("f", "toggle_follow", "Follow the log on / off", "run detail"),
    KeyAction("escape", "back", "Back to the runs table", "run detail"),
)

CONTROL_ACTIONS = frozenset(a.action for a in ACTIONS if a.control)
