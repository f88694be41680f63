"""Run again with changes, from the dashboard: `R` on a run that has ended opens the knob dialog
with its knobs as it ran; what the person edits goes into a new run from its spec, which is then
selected. Driven at 80×24 as a person drives it."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Label

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.screens.dialogs import KnobScreen
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from tests.tui.conftest import make_app, messages, run, settle, until, wait_workers
from tests.tui.fake_backend import FakeBackend

RUNNING = "ra1b2c3d4e5"
QUEUED = "re5f6a7b8c9"
SUCCEEDED = "rc9d0e1f2a3"
FAILED = "r0a1b2c3d4e"


def shown(app: GpuwardenApp) -> set[str]:
    """The actions the footer shows now."""
    return {a.binding.action for a in app.screen.active_bindings.values() if a.enabled and a.binding.show}


def offered(app: GpuwardenApp) -> set[str]:
    """The actions a key does something for now, shown or not (parameters left out)."""
    return {a.binding.action.split("(")[0] for a in app.screen.active_bindings.values() if a.enabled}


async def _runs_tab(pilot: Pilot[None], app: GpuwardenApp, run_id: str) -> None:
    await settle(pilot)
    await pilot.press("2")
    await until(pilot, lambda: app.main.runs.selected_id() is not None, "the runs table")
    app.main.runs.select(run_id)
    await until(pilot, lambda: app.main.runs.selected_id() == run_id, "the run selected")


def test_rerun_a_finished_run_with_one_knob_changed() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            assert "rerun_run(1)" in shown(app) and not {"edit_run", "tune_run"} & offered(app)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert "Run captcha-bf16 again" in titles
            old_spec = fake.run_detail(SUCCEEDED).spec
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            field = app.screen.query_one(Input)
            await until(pilot, lambda: field.has_focus, "the knobs to edit")
            assert field.value.startswith(f"batch_size={old_spec['train']['batch_size']}")
            await pilot.press("ctrl+a", "ctrl+k", *"batch_size=16", "enter")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")
            (rerun,) = [a for a in fake.actions if a[0] == "rerun"]
            assert rerun == ("rerun", SUCCEEDED, {"batch_size": 16})
            await until(
                pilot, lambda: app.main.runs.selected_id() not in (None, SUCCEEDED), "the new run selected"
            )
            new_id = app.main.runs.selected_id()
            assert new_id is not None
            new_spec = fake.run_detail(new_id).spec
            assert new_spec["train"] == {**old_spec["train"], "batch_size": 16}  # only that knob changed
            assert fake.run_detail(SUCCEEDED).run.state == "succeeded"  # the old run is left as it was
            assert any(
                m.startswith(f"submitted {new_id}: captcha-bf16 again, batch_size=16") for m in messages(app)
            )

    run(body())


def test_a_rerun_that_changes_the_effective_batch_says_what_would_keep_it() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            fake.run_detail(SUCCEEDED).spec["train"]["world_size"] = 1  # as a stored spec has it
            await _runs_tab(pilot, app, SUCCEEDED)
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            field = app.screen.query_one(Input)
            await until(pilot, lambda: field.has_focus, "the knobs to edit")
            await pilot.press("ctrl+a", "ctrl+k", *"batch_size=16", "enter")  # was 4 × 8
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")
            await until(pilot, lambda: any("submitted" in m for m in messages(app)), "the toast")
            (said,) = [m for m in messages(app) if "submitted" in m]
            assert said.endswith(
                "captcha-bf16 again, batch_size=16; the effective batch changes, 32 → 128; grad_accum_steps=2 keeps it"
            ), said
            # Said above the runs' foot line, which still names the selected run and the sort.
            await until(pilot, lambda: bool(app.screen.query("Toast")), "the toast on screen")
            toast = app.screen.query_one("Toast").region
            foot = app.screen.query_one("#runs-foot").region
            assert toast.height >= 4 and toast.bottom <= foot.y, (toast, foot)

    run(body())


def test_rerun_from_the_run_screen_keeps_what_was_typed_right_after_R() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, FAILED)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            await until(pilot, lambda: screen.detail is not None, "the run read")
            # Its footer is full with r, e and t at 80 columns: R works there unshown.
            assert "rerun_run" in offered(app) and "rerun_run(1)" not in shown(app)
            # Typed in one go, as a paste sends it: the keys after R land in the dialog.
            await pilot.press("R", "ctrl+a", "ctrl+k", *"precision=fp16", "enter")
            await until(pilot, lambda: any(a[0] == "rerun" for a in fake.actions), "the new run submitted")
            assert ("rerun", FAILED, {"precision": "fp16"}) in fake.actions
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "back on the runs tab")
            await until(
                pilot, lambda: app.main.runs.selected_id() not in (None, FAILED), "the new run selected"
            )
            assert app.main.tab == "runs"

    run(body())


def test_cancel_leaves_nothing() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            count = len(fake.runs())
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            await pilot.press(*"batch_size=2", "escape")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog closed")
            await wait_workers(pilot)
            assert not [a for a in fake.actions if a[0] in ("rerun", "restart_with", "submit")]
            assert len(fake.runs()) == count and app.main.runs.selected_id() == SUCCEEDED

    run(body())


def test_a_refused_rerun_stays_in_the_dialog_with_what_was_typed() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            dialog = app.screen
            await pilot.press("ctrl+a", "ctrl+k", *"lr=0.1", "enter")
            error = dialog.query_one("#knob-error")
            await until(pilot, lambda: "not a knob" in str(error.render()), "the unknown knob named")
            assert isinstance(app.screen, KnobScreen) and dialog.query_one(Input).value == "lr=0.1"
            assert not [a for a in fake.actions if a[0] == "rerun" and a[2] != {"lr": 0.1}]

    run(body())


@pytest.mark.parametrize("run_id", [RUNNING, QUEUED])
def test_a_run_not_ended_is_offered_edit_not_rerun(run_id: str) -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, run_id)
            assert "rerun_run" not in offered(app)
            assert ("edit_run" in offered(app)) == (run_id == QUEUED)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert not [t for t in titles if t.endswith(" again")]
            await pilot.press("R")
            await until(pilot, lambda: any("it has not" in m for m in messages(app)), "why not")
            said = next(m for m in messages(app) if "it has not" in m)
            assert "(e)" in said
            assert isinstance(app.screen, MainScreen) and not [a for a in fake.actions if a[0] == "rerun"]

    run(body())


def test_a_finished_run_refuses_edit_naming_run_again() -> None:
    async def body() -> None:
        app = make_app(FakeBackend())
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            await pilot.press("e")
            await until(pilot, lambda: bool(messages(app)), "why not")
            assert (
                messages(app)[-1]
                == "captcha-bf16 succeeded: a finished run is not changed — run it again with changes (R)"
            )

    run(body())


def test_readonly_refuses_rerun() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake, readonly=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            assert "rerun_run" not in offered(app)
            await pilot.press("R")
            await until(pilot, lambda: any(m.startswith("read-only") for m in messages(app)), "why not")
            await wait_workers(pilot)
            assert isinstance(app.screen, MainScreen)
            assert not [a for a in fake.actions if a[0] != "close"]

    run(body())


def test_the_dialog_says_it_makes_a_new_run() -> None:
    async def body() -> None:
        app = make_app(FakeBackend())
        async with app.run_test(size=(80, 24)) as pilot:
            await _runs_tab(pilot, app, SUCCEEDED)
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            title = str(app.screen.query_one(".title", Label).render())
            assert title == "Run captcha-bf16 again as a new run, with changes"

    run(body())
