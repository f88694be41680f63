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
    also: tuple[str, ...] = ()  # other actions the same keys are bound to (up and down, both ends)
    hosts: bool = False  # offered only with several hosts (`gpuwarden tui --host …`)


ACTIONS: tuple[KeyAction, ...] = (
    KeyAction("1", "show_tab('overview')", "Overview: GPU cards, host, processes", "everywhere"),
    KeyAction("2", "show_tab('runs')", "Runs table", "everywhere"),
    KeyAction("3", "show_tab('history')", "History charts", "everywhere"),
    KeyAction("?", "help", "This help", "everywhere"),
    KeyAction("ctrl+p", "command_palette", "Command palette: every action, by name", "everywhere"),
    KeyAction("q", "quit", "Quit (the daemon and its runs go on)", "everywhere"),
    KeyAction(
        "n",
        "submit",
        "Submit a run spec (path completion; ctrl+t chooses the host with several)",
        "overview, runs, history",
        control=True,
    ),
    KeyAction(
        "j / k",
        "cursor_down",
        "Down / up (also ↓ ↑)",
        "tables, run detail",
        also=("cursor_up", "scroll_down", "scroll_up"),
    ),
    KeyAction(
        "g / G",
        "first_row",
        "First / last row (also home / end)",
        "tables, run detail",
        also=("last_row", "scroll_home", "scroll_end"),
    ),
    KeyAction("m / M", "cycle_metric", "Next / previous chart metric (GPUs)", "overview, history"),
    KeyAction(
        "x", "kill_process", "Terminate the selected GPU process (yours only)", "overview", control=True
    ),
    KeyAction("enter", "open_run", "Open the selected run", "runs"),
    KeyAction("/", "filter_runs", "Filter by name, id or state (esc clears)", "runs", also=("clear_filter",)),
    KeyAction("o", "sort_runs", "Sort by state, newest, name, progress", "runs"),
    KeyAction("s", "stop_run", "Stop the run (asks first)", "runs, run detail", control=True),
    KeyAction(
        "r", "resume_run", "Resume a stopped, failed or interrupted run", "runs, run detail", control=True
    ),
    KeyAction("e", "edit_run", "Change its knobs and start it again", "runs, run detail", control=True),
    KeyAction("t", "tune_run", "Tune: probe the fastest micro-batch", "runs, run detail", control=True),
    KeyAction("R", "rerun_run", "Run it again as a new run, knobs changed", "runs, run detail", control=True),
    KeyAction("c", "choose_metrics", "Choose the metrics charted (GPUs and host)", "history"),
    KeyAction("w / W", "cycle_window", "Next / previous window (5m 1h 24h 7d 30d)", "history"),
    KeyAction("← / →", "cursor", "Move the cursor (its values and time are above each chart)", "history"),
    KeyAction("home / end", "cursor_edge", "Cursor to the oldest / newest point", "history"),
    KeyAction("a / c / l / d", "detail_tab", "Timeline / charts / log / doctor tab", "run detail"),
    KeyAction("v", "toggle_evidence", "Each retune's raw evidence, on / off", "run detail"),
    KeyAction("o", "show_stream('stderr')", "Log: stdout / stderr (the footer names which)", "run detail"),
    KeyAction("f", "toggle_follow", "Log: follow on / off", "run detail"),
    KeyAction("escape", "back", "Back to the runs table", "run detail"),
    KeyAction("4", "show_hosts", "Hosts: every GPU of every host", "everywhere", hosts=True),
    KeyAction("f", "toggle_sort", "Sort by free memory / by host", "hosts", hosts=True),
)

CONTROL_ACTIONS = frozenset(a.action for a in ACTIONS if a.control)
