"""Warm restarts: beside each attempt of a user's Python script, its next attempt's interpreter,
started with the script's libraries already imported (`core/warm_boot.py`).

A restart after an out-of-memory otherwise pays the whole start of the script again — for a
Trainer script, importing torch, transformers and accelerate takes seconds before the first line
of the script runs. The standby does that while the attempt runs; when the next attempt starts, it
is handed the attempt (argv, environment, folder, output files) and runs the script at once. It
is handed one only when nothing its imports could have read differs: the same interpreter, script,
working folder, memory limit and umask, and the same environment but for the variables the
daemon sets for each attempt and those bound to the run's knobs. Otherwise it is killed and the
attempt starts cold, as it always did.

A standby is the next attempt's process from the start: it carries that attempt's tag, its exit
is recorded in that attempt's folder, and it leads its own session. It reads its orders from a
pipe this daemon holds, so a daemon that dies takes its standbys with it (they read the end of
their input and exit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden.core import warm_boot
from gpuwarden.core.private import write_private_text
from gpuwarden.daemon.process import Child, spawn
from gpuwarden.daemon.run_environment import PER_PROCESS

log = logging.getLogger("gpuwarden.daemon.supervisor")

BOOT = str(Path(warm_boot.__file__).resolve())
KILL_WAIT_S = 5.0
# Importing torch and transformers takes about a GiB of host memory; below this much free a
# standby would compete with the attempt it waits beside.
MIN_AVAILABLE_BYTES = 4 << 30


@dataclass(frozen=True)
class WarmLaunch:
    """What an attempt of a Python script starts with, as far as a standby must match it."""

    argv: list[str]  # [python, script, …] or [python, -m, module, …]
    env: dict[str, str]
    cwd: Path
    memory_limit: int | None
    umask: int | None

    @property
    def target(self) -> tuple[str, ...]:
        """The interpreter and what it runs: equal for the attempt a standby can become."""
        head = self.argv[:3] if self.argv[1:2] == ["-m"] else self.argv[:2]
        return tuple(head)


@dataclass
class Standby:
    """A started standby: for which attempt of which run, started how."""

    run_id: str
    attempt: int
    launch: WarmLaunch
    child: Child
    folder: Path  # its output until it is handed an attempt, and the order it is handed

    def alive(self) -> bool:
        return self.child.poll() is None


def _available_memory() -> int:
    return int(psutil.virtual_memory().available)


def boot_argv(argv: list[str]) -> list[str]:
    """`argv` ([python, script or -m module, …]) started through the warm boot."""
    return [argv[0], "-c", warm_boot.STUB, BOOT, "--", *argv[1:]]


def differences(standby: WarmLaunch, attempt: WarmLaunch, may_differ: Collection[str]) -> list[str]:
    """What keeps `standby` from becoming `attempt` (nothing: it can)."""
    found = []
    if standby.target != attempt.target:
        found.append("another program")
    if standby.cwd != attempt.cwd:
        found.append("another working folder")
    if (standby.memory_limit, standby.umask) != (attempt.memory_limit, attempt.umask):
        found.append("another memory limit or umask")
    names = {*standby.env, *attempt.env} - set(may_differ)
    changed = sorted(n for n in names if standby.env.get(n) != attempt.env.get(n))
    if changed:
        found.append(f"the environment ({', '.join(changed[:3])})")
    return found


class LocalWarmStarts:
    """The standbys of this daemon's runs, at most one per run."""

    def __init__(self, available_memory: Callable[[], int] = _available_memory) -> None:
        self._standbys: dict[str, Standby] = {}
        self._lock = threading.Lock()
        self._available = available_memory

    def prepare(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        folder: Path,
        exit_file: Path,
        scope_unit: str | None = None,
    ) -> None:
        """Start the standby that may become `attempt` (replacing any the run had); OSError when
        it cannot be started. None on a host short of memory: a standby holds what its imports
        take, and the running attempt may need it."""
        self.discard(run_id)
        if self._available() < MIN_AVAILABLE_BYTES:
            log.info(
                "run %s: no standby for attempt %d: under %d GiB of host memory free",
                run_id,
                attempt,
                MIN_AVAILABLE_BYTES >> 30,
            )
            return
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        child = spawn(
            boot_argv(launch.argv),
            launch.env,
            launch.cwd,
            folder / "stdout.log",
            folder / "stderr.log",
            launch.memory_limit,
            scope_unit,
            exit_file,
            launch.umask,
            stdin_pipe=True,
        )
        with self._lock:
            self._standbys[run_id] = Standby(run_id, attempt, launch, child, folder)

    def take(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        outputs: tuple[Path, Path],
        may_differ: Collection[str],
    ) -> Child | None:
        """The run's standby, handed `launch` as attempt `attempt` (stdout and stderr to
        `outputs`); None when it has none that can become it (any it had is gone then)."""
        with self._lock:
            standby = self._standbys.pop(run_id, None)
        if standby is None:
            return None
        why = differences(standby.launch, launch, may_differ)
        if standby.attempt != attempt:
            why.append(f"it was started for attempt {standby.attempt}")
        if not standby.alive():
            why.append("it has ended")
        if why:
            log.info("run %s: attempt %d starts cold: its standby had %s", run_id, attempt, "; ".join(why))
            _end(standby)
            return None
        order = {
            "argv": launch.argv,
            "env": launch.env,
            "cwd": str(launch.cwd),
            "stdout": str(outputs[0]),
            "stderr": str(outputs[1]),
            "stdout_before": str(standby.folder / "stdout.log"),
            "stderr_before": str(standby.folder / "stderr.log"),
        }
        path = standby.folder / "order.json"
        try:
            write_private_text(path, json.dumps(order))
            _say(standby.child, f"{path}\n")
        except OSError as exc:
            log.info(
                "run %s: attempt %d starts cold: its standby could not be handed it (%s)",
                run_id,
                attempt,
                exc,
            )
            _end(standby)
            return None
        return standby.child

    def discard(self, run_id: str) -> None:
        """End the run's standby, if any, and wait until it has."""
        with self._lock:
            standby = self._standbys.pop(run_id, None)
        if standby is not None:
            _end(standby)

    def standby(self, run_id: str) -> Standby | None:
        """The run's standby, if it has one."""
        with self._lock:
            return self._standbys.get(run_id)

    def close(self) -> None:
        """Let every standby go (each exits at the end of its input), without waiting."""
        with self._lock:
            standbys, self._standbys = list(self._standbys.values()), {}
        for standby in standbys:
            with contextlib.suppress(OSError):
                _say(standby.child, "")


def _say(child: Child, line: str) -> None:
    """Write `line` to the standby's input and close it (its one order, or none)."""
    pipe = child.popen.stdin if child.popen is not None else None
    if pipe is None:
        raise OSError("the standby has no input to write to")
    try:
        if line:
            pipe.write(line.encode())
    finally:
        pipe.close()


def _end(standby: Standby) -> None:
    """Kill the standby's process group and wait for it (its exit-status recorder included, so
    nothing it records can land in the folder of the attempt that starts instead)."""
    with contextlib.suppress(OSError):
        _say(standby.child, "")
    standby.child.signal_group(signal.SIGKILL)
    if standby.child.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            standby.child.popen.wait(timeout=KILL_WAIT_S)
    shutil.rmtree(standby.folder, ignore_errors=True)


def per_attempt_names(bound: Collection[str]) -> frozenset[str]:
    """The variables an attempt's environment may change without a standby's imports having read
    them: what the daemon sets for each attempt, and those bound to the run's knobs (`bound`)."""
    return frozenset({*PER_PROCESS, *bound})


def standby_folder(run_dir: Path, attempt: int) -> Path:
    """Where the standby for `attempt` writes until it is handed it."""
    return run_dir / "warm" / str(attempt)
