"""A fake process layer and a fake clock: the supervisor's state machine driven in-process.

`FakeProcesses` stands for the machine's process table. A spawned `FakeProcess` runs until the
test ends it (`exit`) or a signal does; it writes events, stdout and stderr into the real attempt
files, so the supervisor reads them exactly as it reads a real runner's. Handles (`FakeChild`) are
what the supervisor holds: one from `spawn` knows the exit status (a child of ours), one from
`adopt` does not (a previous daemon's child), as with real processes. A process spawned with an
`exit_file` writes its status there when it ends, as the real exit-status recorder does.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.exit_record import write_status
from gpuwarden.core.gang.files import rank_events_path
from gpuwarden.daemon.process import RUN_TAG, ExitStatus, Tagged, run_tag
from gpuwarden.daemon.stack_dump import DumpTarget, StackDump
from gpuwarden.daemon.supervise.backends import ChildProcess


class FakeClock:
    """Time that moves only when the test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeProcess:
    """One process in the fake process table, with the files the supervisor gave it."""

    pid: int
    create_time: float
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    stdout: Path
    stderr: Path
    memory_limit: int | None
    exit_file: Path | None = None
    ignores_sigterm: bool = False
    status: ExitStatus | None = None  # None while it runs
    signals: list[int] = field(default_factory=list)
    # Processes it started that are still in its process group (dataloader workers).
    group_members: int = 0
    # A torchrun process: its ranks (rank → pid; each leads a group of its own), what a stack
    # dump of each shows, and the signals the ranks were sent.
    ranks: dict[int, int] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    rank_signals: list[int] = field(default_factory=list)
    # Set: reading its state raises this (a process the daemon is no longer allowed to inspect).
    unreadable: OSError | None = None
    # Called when it ends, as the real process layer's exit watch calls them.
    on_exit: list[Callable[[], None]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.status is None

    @property
    def events_path(self) -> Path:
        return self.stdout.parent / "events.jsonl"

    def emit(self, type_: str, **fields: Any) -> None:
        """Append an event line as a runner does (with `rank`: as that rank of a gang does, to
        its own file)."""
        event = {"v": 1, "type": type_, "ts": 1.0, **fields}
        rank = fields.get("rank")
        path = rank_events_path(self.events_path, rank) if isinstance(rank, int) else self.events_path
        with path.open("a") as fh:
            fh.write(json.dumps(event) + "\n")

    def write_stderr(self, text: str) -> None:
        with self.stderr.open("a") as fh:
            fh.write(text)

    def exit(self, code: int | None = 0, sig: int | None = None, *, recorded: bool = True) -> None:
        """End it; `recorded=False`: its exit-status recorder died with it (no status file)."""
        assert self.running, f"pid {self.pid} already ended"
        self.status = ExitStatus(code=None if sig is not None else code, signal=sig)
        if self.exit_file is not None and recorded:
            write_status(str(self.exit_file), {"code": code or 0} if sig is None else {"signal": sig})
        for callback in self.on_exit:
            callback()

    @property
    def group_alive(self) -> bool:
        return self.running or self.group_members > 0

    def deliver(self, sig: int) -> None:
        """A signal to the whole process group."""
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.group_members = 0
        if self.running and (sig == signal.SIGKILL or (sig == signal.SIGTERM and not self.ignores_sigterm)):
            self.exit(sig=sig, recorded=sig != signal.SIGKILL)  # a group SIGKILL takes the recorder too

    def deliver_tree(self, sig: int) -> None:
        """A signal to its group and to every rank's."""
        self.deliver(sig)
        if self.ranks:
            self.rank_signals.append(sig)
        if sig == signal.SIGKILL:
            self.ranks = {}


class FakeChild:
    """The supervisor's handle on a FakeProcess (the ChildProcess protocol)."""

    def __init__(self, proc: FakeProcess | None, pid: int, create_time: float, *, adopted: bool) -> None:
        self._proc = proc
        self._pid = pid
        self._create_time = create_time
        self._adopted = adopted

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def create_time(self) -> float:
        return self._create_time

    @property
    def adopted(self) -> bool:
        return self._adopted

    def poll(self) -> ExitStatus | None:
        if self._proc is None:
            return ExitStatus(code=None, signal=None)
        if self._proc.unreadable is not None:
            raise self._proc.unreadable
        if self._proc.running:
            return None
        # A previous daemon's child: this one cannot know how it ended.
        return ExitStatus(code=None, signal=None) if self._adopted else self._proc.status

    def group_alive(self) -> bool:
        return self._proc is not None and self._proc.group_alive

    def signal_group(self, sig: int) -> bool:
        if self._proc is None or not self._proc.group_alive:
            return False
        self._proc.deliver(sig)
        return True

    def signal_tree(self, sig: int) -> bool:
        if self._proc is None or not (self._proc.group_alive or self._proc.ranks):
            return False
        self._proc.deliver_tree(sig)
        return True


class FakeProcesses:
    """The process table: what the supervisor spawned, adoptable across supervisor instances."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.table: dict[int, FakeProcess] = {}
        self.spawned: list[FakeProcess] = []
        self.fail_with: OSError | None = None  # the next spawns raise this
        self.ignores_sigterm = False  # processes spawned from now on ignore SIGTERM
        self.dumped: list[list[int]] = []  # the ranks of each stack dump asked for
        self._next_pid = 4000

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | None,
        stdout_path: Path,
        stderr_path: Path,
        memory_limit: int | None = None,
        scope_unit: str | None = None,
        exit_file: Path | None = None,
        umask: int | None = None,
    ) -> FakeChild:
        if self.fail_with is not None:
            raise self.fail_with
        if any("\0" in text for text in [*argv, *env.values()]):
            raise ValueError("embedded null byte")  # as subprocess.Popen refuses one
        self._next_pid += 1
        proc = FakeProcess(
            pid=self._next_pid,
            create_time=self.clock(),
            argv=list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=stdout_path,
            stderr=stderr_path,
            memory_limit=memory_limit,
            exit_file=exit_file,
            ignores_sigterm=self.ignores_sigterm,
        )
        stdout_path.touch()
        stderr_path.touch()
        self.table[proc.pid] = proc
        self.spawned.append(proc)
        return FakeChild(proc, proc.pid, proc.create_time, adopted=False)

    def adopt(self, pid: int, create_time: float) -> FakeChild:
        proc = self.table.get(pid)
        if proc is not None and proc.create_time != create_time:
            proc = None  # the pid was reused: not the attempt's process
        return FakeChild(proc, pid, create_time, adopted=True)

    def on_exit(self, child: ChildProcess, callback: Callable[[], None]) -> None:
        proc = self.table.get(child.pid)
        if proc is None or not proc.running:
            callback()
        else:
            proc.on_exit.append(callback)

    @property
    def last(self) -> FakeProcess:
        return self.spawned[-1]

    def start_probe(self, run_id: str, work_dir: Path) -> FakeProcess:
        """A probe process as a retune or autotune starts it (tagged for the run, own session)."""
        work_dir.mkdir(parents=True, exist_ok=True)
        child = self.spawn(["probe"], {RUN_TAG: run_tag(run_id, None)}, None, work_dir / "o", work_dir / "e")
        self.spawned.pop()
        return self.table[child.pid]

    def tagged(self) -> list[Tagged]:
        found = []
        for proc in self.table.values():
            tag = proc.env.get(RUN_TAG)
            if tag is None or not proc.group_alive:
                continue
            run_id, _, number = tag.partition("/")
            attempt = int(number) if number.isdigit() else None
            found.append(Tagged(run_id, attempt, proc.pid, proc.create_time, proc.pid, proc.running))
        return found

    def kill(self, processes: Collection[Tagged]) -> None:
        for tagged in processes:
            self.table[tagged.pid].deliver(signal.SIGKILL)

    def ranks(self, pid: int) -> dict[int, int]:
        proc = self.table.get(pid)
        return dict(proc.ranks) if proc is not None and proc.running else {}

    def program(self, pid: int) -> int:
        return pid  # no recorder between the supervisor and a fake program

    def dump_stacks(self, targets: Sequence[DumpTarget]) -> list[StackDump]:
        """What each rank's dump shows (`FakeProcess.stacks`), as SIGUSR1 dumps."""
        self.dumped.append([t.rank for t in targets])
        out = []
        for t in targets:
            owner = next((p for p in self.table.values() if p.ranks.get(t.rank) == t.pid), None)
            text = owner.stacks.get(t.rank) if owner is not None else None
            out.append(StackDump(t.rank, t.pid, "SIGUSR1", text, "" if text else "nothing written"))
        return out


class Workers:
    """The supervisor's thread starter: runs work at once, or (`hold`) when the test says."""

    def __init__(self) -> None:
        self.hold = False
        self.pending: list[tuple[str, Callable[[], None]]] = []
        self.names: list[str] = []

    def __call__(self, name: str, work: Callable[[], None]) -> None:
        self.names.append(name)
        if self.hold:
            self.pending.append((name, work))
        else:
            work()

    def release(self) -> None:
        pending, self.pending = self.pending, []
        for _, work in pending:
            work()
