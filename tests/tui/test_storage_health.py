"""The daemon cannot write its store: the dashboard's top line says so, on every screen and under
its dialogs, for as long as the daemon's health says so (the same against a real daemon whose
database is made immutable: tests/tui/test_api_e2e.py)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.screens.help import HelpScreen
from tests.tui.conftest import make_app, messages, run, settle, until
from tests.tui.fake_backend import FakeBackend
from tests.tui.test_app import text_of
from tests.tui.test_person import RUNNING, open_run_screen

STATE = "/home/ana/.local/state/gpuwarden"
FAULT = (
    f"cannot write {STATE}/gpuwarden.db: marked immutable — clear the flag (chattr -i {STATE}/gpuwarden.db)"
)
# What fits in 80 columns: which file, why, and the start of the fix.
AT_80 = "storage: cannot write …/gpuwarden.db: marked immutable — clear the flag (chat…"
BACK = "the daemon can write its store again"


def _watched(fake: FakeBackend) -> GpuwardenApp:
    app = make_app(fake)
    app.health_poll_s = 0.05  # the test waits on the poll, not on a few seconds of it
    return app


def test_the_top_line_warns_while_the_daemon_cannot_write_its_store() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = _watched(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            status = app.query_one("#status", Static)
            before = text_of(status)
            assert "storage" not in before

            fake.fault = FAULT
            await until(pilot, lambda: "storage:" in text_of(status), "the fault in the top line")
            assert text_of(status) == AT_80
            shown = status.content
            assert isinstance(shown, Text) and {s.style for s in shown.spans} == {"bold yellow", "yellow"}
            assert messages(app)[-1].startswith(FAULT)  # the whole line once, in a toast

            fake.fault = None
            await until(pilot, lambda: "storage" not in text_of(status), "the warning gone")
            assert text_of(status) == before
            assert messages(app)[-1] == BACK

    run(body())


def test_a_wide_top_line_keeps_the_whole_fault_and_the_host() -> None:
    async def body() -> None:
        fake = FakeBackend()
        fake.fault = FAULT
        app = _watched(fake)
        async with app.run_test(size=(200, 30)) as pilot:
            await settle(pilot)
            line = text_of(app.query_one("#status", Static))
            assert line.startswith(f"gpuwarden  gpu-box  storage: {FAULT}  "), line

    run(body())


def test_the_run_screen_and_the_help_over_it_keep_the_warning_in_sight() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = _watched(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, RUNNING)
            head = screen.query_one("#run-head", Static)
            assert "storage" not in text_of(head)

            fake.fault = FAULT
            await until(pilot, lambda: text_of(head).startswith(AT_80 + "\n"), "the fault atop the run")
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
            assert head.region.y == 0
            assert min(w.region.y for w in app.screen.children) >= 1, "the help covers the top line"

            fake.fault = None
            await until(pilot, lambda: "storage" not in text_of(head), "the warning gone from the run")

    run(body())
