"""Smoke test as a user over SSH would work: the real dashboard in tmux at 80×24 with 256
colours, against a real daemon; no mouse. The screen shows the host panel and a submitted run,
keys stop the run, the window grows to 120×40 and the dashboard fills it, and the daemon goes
away and comes back while the dashboard says so."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonHandle, daemon_factory, short_tmp, wait_for  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]


@pytest.fixture
def tmux(daemon_factory: Callable[[], DaemonHandle]) -> Iterator[tuple[str, DaemonHandle]]:  # noqa: F811
    daemon = daemon_factory()  # two fake H100s
    session = f"gw-{uuid.uuid4().hex[:8]}"
    # COLUMNS/LINES (set by pytest's terminal) would pin the dashboard to one size: Textual
    # prefers them to the terminal's. A tmux server of its own (-L) inherits none of a user's.
    env = {k: v for k, v in daemon.env.items() if k not in ("COLORTERM", "COLUMNS", "LINES")}
    env["TERM"] = "screen-256color"
    env_args = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
    LOGS[session] = daemon.root / "tui.log"
    subprocess.run(
        ["tmux", "-L", session, "new-session", "-d", "-s", session, "-x", "80", "-y", "24", *env_args,
         sys.executable, "-m", "gpuwarden", "tui", "--log", str(LOGS[session])],
        check=True, timeout=20, env=env,
    )  # fmt: skip
    try:
        yield session, daemon
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True, timeout=20)
        LOGS.pop(session, None)


# The dashboard's own log per tmux session (`gpuwarden tui --log`): what it saw, for failures.
LOGS: dict[str, Path] = {}


def _live_top_line(screen: str) -> bool:
    top = screen.splitlines()[0] if screen.strip() else ""
    return " daemon " in top and "not reachable" not in top


def _log(session: str) -> str:
    path = LOGS.get(session)
    return path.read_text() if path is not None and path.exists() else ""


def _screen(session: str) -> str:
    out = subprocess.run(
        ["tmux", "-L", session, "capture-pane", "-p", "-t", session],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return out.stdout


def _wait_for(session: str, ok: Callable[[str], bool], timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if ok(screen):
            return screen
        time.sleep(0.3)
    raise AssertionError(
        f"screen never matched; last screen:\n{screen}\nthe dashboard's log:\n{_log(session)[-3000:]}"
    )


def _keys(session: str, *keys: str) -> None:
    for key in keys:
        subprocess.run(["tmux", "-L", session, "send-keys", "-t", session, key], check=True, timeout=20)


def _fits(screen: str, width: int, height: int) -> bool:
    lines = screen.splitlines()
    return len(lines) <= height and all(len(line) <= width for line in lines)


def test_dashboard_in_tmux_shows_host_and_run_and_stops_it(tmux: tuple[str, DaemonHandle]) -> None:
    session, daemon = tmux
    run = daemon.submit(
        {
            "name": "tmux-sleeper",
            "kind": "command",
            "command": {
                "argv": [sys.executable, "-c", "import time; print('working', flush=True); time.sleep(120)"]
            },
            "resources": {"gpus": 1},
        }
    )
    daemon.wait_state(run["id"], ("running",))
    screen = _wait_for(session, lambda s: "H100" in s and "host" in s.lower())
    assert _fits(screen, 80, 24)
    _keys(session, "2")
    screen = _wait_for(session, lambda s: "tmux-sleeper" in s and "running" in s)
    assert run["id"] in screen  # the whole id, even at 80 columns
    _keys(session, "s")
    _wait_for(session, lambda s: "Stop run tmux-sleeper" in s)
    _keys(session, "y")
    final = daemon.wait_state(run["id"], timeout=30)
    assert final["state"] == "stopped"
    _wait_for(session, lambda s: "stopped" in s)

    # A bigger window: the history is fetched again for the width, its axis reaches the edge.
    subprocess.run(
        ["tmux", "-L", session, "resize-window", "-t", session, "-x", "120", "-y", "40"],
        check=True,
        timeout=20,
    )
    _keys(session, "3")
    screen = _wait_for(
        session, lambda s: any(line.endswith("now") and len(line) > 110 for line in s.splitlines())
    )
    assert _fits(screen, 120, 40) and len(screen.splitlines()) > 30

    # The daemon goes away: the dashboard says so and offers no control; it comes back by itself.
    daemon.stop()
    _wait_for(session, lambda s: "daemon not reachable — reconnecting (gpuwarden up starts it)" in s)
    daemon.start()
    _keys(session, "2")
    # Back by itself: the top line names the daemon again and the runs are shown. (The warning
    # toast may outlive the reconnection by a few seconds: its own timeout.)
    _wait_for(session, lambda s: _live_top_line(s) and "tmux-sleeper" in s and "stopped" in s)
    # Its log (--log) tells the story: connected, the stream lost with the daemon, what the user
    # was told, connected again — and only once: a stream that kept failing would log each end
    # (attempts while the daemon was away log "could not connect").
    wait_for(lambda: _log(session).count("connected: daemon") >= 2, "the reconnection in the log", timeout=30)
    log = _log(session)
    assert log.count("connected: daemon") == 2 and log.count("live stream ended") == 1, log
    assert "live stream ended" in log and "told the user: [connection] daemon not reachable" in log, log
