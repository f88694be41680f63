"""The run controls: stop, resume, tune, edit, run again, terminate a process and submit. Each
asks first where it should (a confirmation, the knob dialog, the submit dialog), then runs the
backend's call in a thread worker of the group "control"; the app reports the worker's end here
(`succeeded`, `failed`) and a refusal in one line."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App
from textual.worker import Worker

from gpuwarden.tui.backend import DashboardBackend, HostsSource, ProcessInfo, RunDetailView, RunRow
from gpuwarden.tui.controls import PendingStops
from gpuwarden.tui.dashboard import Dashboard
from gpuwarden.tui.key_hold import KeyHold
from gpuwarden.tui.knobs import current_knobs, knob_changes
from gpuwarden.tui.rerun_spec import effective_batch_note, rerun_spec
from gpuwarden.tui.screens.dialogs import ConfirmScreen, KnobScreen, SubmitScreen


class RunControls:
    """`app` shows the dialogs and runs the workers; `reload` reads the runs again after a change;
    `show_new` selects a run just submitted."""

    def __init__(
        self,
        app: App[Any],
        dashboard: Dashboard,
        hold: KeyHold,
        reload: Callable[[], None],
        show_new: Callable[[str], None],
    ) -> None:
        self.app = app
        self.dashboard = dashboard
        self.hold = hold
        self.reload = reload
        self.show_new = show_new
        self.stops = PendingStops()
        self._on_done: dict[Worker[Any], Callable[[Any], None]] = {}
        self._on_failed: dict[Worker[Any], Callable[[], None]] = {}

    @property
    def backend(self) -> DashboardBackend:
        return self.dashboard.backend

    # -- the workers ---------------------------------------------------------------------------

    def control(
        self,
        label: str,
        call: Callable[..., Any],
        *args: Any,
        done: Callable[[Any], None] | None = None,
        failed: Callable[[], None] | None = None,
    ) -> None:
        """Run a control in a thread; its result or refusal is reported by the app's worker handler."""
        if self.dashboard.control_refusal() is not None:
            if failed is not None:
                failed()
            return
        worker = self.app.run_worker(
            partial(call, *args), name=label, group="control", thread=True, exit_on_error=False
        )
        if done is not None:
            self._on_done[worker] = done
        if failed is not None:
            self._on_failed[worker] = failed

    def succeeded(self, worker: Worker[Any]) -> None:
        self._on_failed.pop(worker, None)
        done = self._on_done.pop(worker, None)
        if done is not None:
            done(worker.result)
        else:
            self.app.notify(f"{worker.name}: done", timeout=4)

    def failed(self, worker: Worker[Any]) -> None:
        self._on_done.pop(worker, None)
        if (failed := self._on_failed.pop(worker, None)) is not None:
            failed()

    # -- stops -----------------------------------------------------------------------------------

    def ask_stop(self, run: RunRow) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.control(
                    f"stop {run.name}", self.backend.stop_run, run.id, done=lambda _: self._stop_sent(run)
                )

        detail = (
            "SIGTERM to its process group: it writes a checkpoint, then is killed after the grace period."
            if run.state != "queued"
            else "It leaves the queue before it starts."
        )
        self.app.push_screen(ConfirmScreen(f"Stop run {run.name} ({run.id})?", detail), answered)

    def _stop_sent(self, run: RunRow) -> None:
        self.app.notify(self.stops.asked(run), timeout=4)
        self.tell_stopped()  # its stopped state may have come first

    def tell_stopped(self) -> None:
        """One toast for each run asked to stop that has now ended."""
        for line in self.stops.ended(self.dashboard.live.runs):
            self.app.notify(line, timeout=4)

    # -- resume, tune, terminate -----------------------------------------------------------------

    def ask_resume(self, run: RunRow) -> None:
        said = f"{run.name}: queued again, it resumes from its last checkpoint"
        self.control(
            f"resume {run.name}", self.backend.resume_run, run.id, done=lambda _: self.app.notify(said)
        )

    def ask_tune(self, run: RunRow) -> None:
        said = f"{run.name}: queued to probe the fastest micro-batch, then go on"
        self.control(f"tune {run.name}", self.backend.tune, run.id, done=lambda _: self.app.notify(said))

    def ask_kill(self, proc: ProcessInfo) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.control(f"terminate {proc.pid}", self.backend.kill_process, proc.pid)

        question = ConfirmScreen(
            f"Terminate process {proc.pid}?", f"{proc.command}\nSIGTERM, then SIGKILL if it stays."
        )
        self.app.push_screen(question, answered)

    # -- the knob dialog -------------------------------------------------------------------------

    def ask_edit(self, run: RunRow, detail: RunDetailView | None = None) -> None:
        """The knob dialog, with the run's knobs and their values (read first if not at hand)."""
        self._with_spec(run, detail, self._edit_dialog)

    def ask_rerun(self, run: RunRow, detail: RunDetailView | None = None) -> None:
        """The knob dialog for a new run from `run`'s spec (read first if not at hand)."""
        self._with_spec(run, detail, self._rerun_dialog)

    def _with_spec(
        self, run: RunRow, detail: RunDetailView | None, dialog: Callable[[RunRow, dict[str, Any]], None]
    ) -> None:
        self.hold.start()  # what is typed while the run is read goes into the dialog
        if detail is not None:
            dialog(run, detail.spec)
            return
        self.control(
            f"read {run.name}",
            self.backend.run_detail,
            run.id,
            done=lambda d: dialog(run, d.spec),
            failed=self.hold.drop,
        )

    def _edit_dialog(self, run: RunRow, spec: dict[str, Any]) -> None:
        knobs = current_knobs(run.kind, spec)

        def apply(typed: dict[str, Any]) -> None:
            """Runs in the dialog's thread: a refusal stays in the dialog with what was typed."""
            self.backend.restart_with(run.id, knob_changes(run.kind, typed, knobs))

        def answered(changes: dict[str, Any] | None) -> None:
            if changes:
                shown = ", ".join(f"{k}={v}" for k, v in changes.items())
                self.app.notify(f"{run.name}: {shown}; it starts again with them")
                self.reload()

        self.app.push_screen(KnobScreen(run.name, knobs, apply), answered)

    def _rerun_dialog(self, run: RunRow, spec: dict[str, Any]) -> None:
        created: list[str] = []
        notes: list[str] = []

        def apply(typed: dict[str, Any]) -> None:
            """Runs in the dialog's thread: a refusal stays in the dialog with what was typed."""
            created.append(self.backend.rerun(run.id, typed))
            note = effective_batch_note(run.kind, spec, rerun_spec(run.kind, spec, typed))
            notes[:] = [note] if note else []

        def answered(changes: dict[str, Any] | None) -> None:
            if changes is not None and created:
                shown = "".join(f", {k}={v}" for k, v in changes.items())
                said = "".join(f"; {n.removeprefix('note: ')}" for n in notes)
                self.app.notify(
                    f"submitted {created[-1]}: {run.name} again{shown}{said}", timeout=6 if said else 4
                )
                self.show_new(created[-1])

        dialog = KnobScreen(run.name, current_knobs(run.kind, spec), apply, again=True)
        self.app.push_screen(dialog, answered)

    # -- submit ----------------------------------------------------------------------------------

    def ask_submit(self) -> None:
        if self.dashboard.control_refusal() is not None:
            self.hold.drop()
            return

        def answered(run_id: str | None) -> None:
            if run_id:
                self.app.notify(f"submitted {run_id}", timeout=4)
                self.show_new(run_id)

        self.hold.start()
        cwd = self.dashboard.cwd or Path.cwd()
        backend = self.backend
        fleet = backend if isinstance(backend, HostsSource) else None
        if fleet is not None and len(fleet.host_names) > 1:
            dialog = SubmitScreen(cwd, hosts=fleet.host_names, submit_to=fleet.submit_to)
        else:
            dialog = SubmitScreen(cwd, backend.submit)
        self.app.push_screen(dialog, answered)
