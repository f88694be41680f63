"""A job's supervisor: one run, the daemon's supervisor around it, its store in the run's folder.

Built from the same parts as the daemon (`daemon/wiring.py`, `daemon/sampling.py`): placement
on the job's GPUs, OOM classification and the retune policy, the restart policy, probes, the
hang watchdog, checkpoints. What differs is the host: the store is `RUN_DIR/run.db` with a
rollback journal (safe on NFS and Lustre, where SQLite's WAL is not), written by this process
alone; nothing listens on a socket; the output is the run's own (`gpuwarden exec` prints it as
`run --follow` does); and a stop asked for by a signal ends the process with the code that says
"stopped at a checkpoint, start me again".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.private import make_dirs
from gpuwarden.core.run_ref import RUN_ID_RE, new_run_id
from gpuwarden.core.run_state import FINAL_STATES, RESUMABLE_STATES, RunState
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.telemetry.job_gpus import JobGpus, job_devices
from gpuwarden.core.telemetry.types import GpuReader
from gpuwarden.daemon.sampling import Sampling
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.supervise import RetuneHook, Supervisor
from gpuwarden.daemon.wiring import build_supervisor
from gpuwarden.daemon.writer import StoreWriter
from gpuwarden.job import exit_codes
from gpuwarden.job.leader import LeaderMachines
from gpuwarden.job.lock import RunLock
from gpuwarden.job.paths import JobPaths

log = logging.getLogger("gpuwarden.job")

# What an engine tells a job about itself that its run's history keeps.
_JOB_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_NODELIST",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
)


class Silent:
    """The job's publisher: nothing listens live; what happened is read back from the store."""

    def publish(self, kind: str, data: dict[str, Any], run_id: str | None = None) -> None:
        return None


class JobHost:
    """One run folder's supervisor. `open` takes the folder's lock and starts the parts (a live
    attempt a killed exec left is watched again); `submit` or `go_on` gives it its run; `close`
    stops watching (the run's processes are the caller's to end)."""

    def __init__(
        self,
        settings: Settings,
        run_dir: Path,
        *,
        environ: Mapping[str, str] | None = None,
        gpu_reader: GpuReader | None = None,
        retune_hook: RetuneHook | None = None,
        machines: LeaderMachines | None = None,
    ) -> None:
        self.settings = settings
        self.paths = JobPaths.of(run_dir)
        self.environ = dict(os.environ if environ is None else environ)
        self.lock = RunLock(self.paths.lock_file, self.paths.pid_file)
        self.storage = StorageHealth(self.paths.db, run_dir)
        self.writer = StoreWriter(self.paths.db, self.storage, journal="delete")
        self._gpu_reader = gpu_reader
        self.sampling = Sampling(settings, self.writer, self.storage, open_reader=self._job_gpus)
        # A run over several machines: this is the first, and reaches the others through these.
        self.machines = machines
        self.supervisor: Supervisor = build_supervisor(
            settings, self.paths, self.writer, Silent(), self.sampling, retune_hook, machines
        )
        # The folder's run, once `open` has read it; a new run's id comes with `submit`.
        self.run_id = ""
        # Why the run was stopped by this host (a signal's name), if it was: then "start me again".
        self.stopped_for: str | None = None
        self._stops = 0

    @property
    def run_dir(self) -> Path:
        return self.paths.folder

    def open(self) -> None:
        make_dirs(self.run_dir)
        self.lock.acquire()
        if self.machines is not None:
            self.machines.start()
        self.writer.start()
        self.sampling.open()
        log.info("gpus: %s", self.sampling.gpu_status)
        self.supervisor.start()
        self.sampling.start()
        runs = self.writer.call(lambda db: RunStore(db).list_runs(limit=2))
        if len(runs) > 1:
            raise UserError(
                f"{self.run_dir}: holds {len(runs)} runs — a run folder holds one; check the path"
            )
        self.run_id = str(runs[0]["id"]) if runs else ""

    @property
    def has_run(self) -> bool:
        return bool(self.run_id)

    def _job_gpus(self) -> GpuReader:
        """The node's GPUs as NVML sees them, less those the job was not given."""
        from gpuwarden.core.telemetry.nvml import open_gpu_reader

        reader = self._gpu_reader or open_gpu_reader()
        wanted = job_devices(self.environ)
        return reader if wanted is None else JobGpus(reader, wanted)

    def close(self) -> None:
        self.supervisor.stop()
        self.sampling.close()
        self.writer.stop()

    # -- the run -------------------------------------------------------------------------------------

    def submit(
        self, spec: RunSpec, text: str | None, label: str, run_id: str | None = None
    ) -> dict[str, Any]:
        """Queue `spec` as this folder's run (with `run_id`, else a new id); its processes start
        from the job's environment."""
        if self.has_run:
            raise UserError(f"{self.run_dir}: holds run {self.run_id} already — take it up with --run")
        run = self.supervisor.submit(
            spec,
            text,
            label=label,
            check_inputs=True,
            environment=self.environ,
            run_id=run_id or self._named() or new_run_id(),
        )
        self.run_id = str(run["id"])
        return run

    def _named(self) -> str | None:
        """A folder named like a run id (`slurm submit` makes one so) names its run."""
        return self.run_dir.name if RUN_ID_RE.match(self.run_dir.name) else None

    def go_on(self) -> dict[str, Any]:
        """Take up the folder's run again (a requeued job, an exec that was killed): its processes
        start from this job's environment; one stopped or interrupted goes on from its checkpoint."""
        run = self._run()
        self.supervisor.writer.call(lambda db: RunStore(db).set_environment(self.run_id, self.environ))
        state = RunState(run["state"])
        if state in RESUMABLE_STATES:
            return self.supervisor.resume_run(self.run_id)
        return run

    def _run(self) -> dict[str, Any]:
        run = (
            self.supervisor.writer.call(lambda db: RunStore(db).get_run(self.run_id)) if self.run_id else None
        )
        if run is None:
            raise UserError(f"{self.run_dir}: holds no run — start one with `gpuwarden exec SPEC.yaml`")
        return run

    def note_job(self) -> None:
        """A `job` event naming the allocation this start of the run is in, as the engine tells
        it (Slurm's job id, its requeue count, its nodes): a run's history says where each part of
        it ran."""
        fields = {name.lower(): value for name, value in self.environ.items() if name in _JOB_VARIABLES}
        if fields:
            self.supervisor.ctx.event(self.run_id, None, "job", **fields)

    def state(self) -> RunState:
        return RunState(self._run()["state"])

    def stop(self, why: str) -> None:
        """Stop the run at a checkpoint (SIGTERM to it, SIGKILL after the grace period); a second
        call does not wait the grace period out. On a thread of its own: a signal handler must not
        wait for the store while its thread may hold a read of it."""
        self._stops += 1
        self.stopped_for = self.stopped_for or why
        grace = 0.0 if self._stops > 1 else None
        threading.Thread(target=self._stop, args=(grace,), name="exec-stop", daemon=True).start()

    def _stop(self, grace: float | None) -> None:
        try:
            self.supervisor.stop_run(self.run_id, grace)
        except UserError as exc:  # already ended: nothing to stop
            log.info("stop: %s", exc.message)

    def exit_code(self) -> int:
        """The code this exec ends with, for the run's state now (a final one)."""
        state = self.state()
        if state is RunState.SUCCEEDED:
            return exit_codes.SUCCEEDED
        if state is RunState.FAILED:
            return exit_codes.FAILED
        # Stopped for a signal, or interrupted: it stopped at (or can go on from) a checkpoint.
        return exit_codes.RESTART if state in FINAL_STATES else exit_codes.FAILED


def new_run_dir(runs_root: Path) -> Path:
    """A new run's folder under `runs_root` (not created yet)."""
    return runs_root / new_run_id()
