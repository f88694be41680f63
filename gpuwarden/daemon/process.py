"""Attempt processes: spawn in their own session, stop by process group, tell how they ended.

`LocalProcesses` is the supervisor's process layer on this machine (tests hand it a fake one).
The daemon opens the attempt's stdout/stderr files and hands the child their descriptors, so the
daemon is never in the output path and a daemon restart cannot lose a line.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import psutil

from gpuwarden.core.events import EXIT_OK, EXIT_OOM, EXIT_TERMINATED, EXIT_USER_ERROR
from gpuwarden.core.exit_record import is_recorder, read_status, recorded_argv
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.daemon.exit_watch import call_on_exit
from gpuwarden.daemon.stack_dump import DumpTarget, StackDump, dump_stacks

# psutil create times are floats rounded differently across reads; this is far below the time
# it takes the kernel to reuse a pid.
CREATE_TIME_TOLERANCE_S = 0.05
# Set in the environment of every process gpuwarden starts for a run ("<run id>/<attempt>", or
# "<run id>/probe" for a retune's or an autotune's probes), and inherited by what those start: a
# restarted daemon finds them by it, whether or not their pid was recorded.
RUN_TAG = "GPUWARDEN_RUN_TAG"
KILL_WAIT_S = 5.0
SYSTEMD_BUS = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
# Why a re-adopted process (not our child, and no recorded exit status) that wrote no final event ended.
DIED_SILENTLY = "the re-adopted process died without a final event (exit status unknown)"


def run_tag(run_id: str, attempt: int | None) -> str:
    """The RUN_TAG value of an attempt's processes (None: of the run's probes)."""
    return f"{run_id}/{'probe' if attempt is None else attempt}"


@dataclass(frozen=True)
class Tagged:
    """A live process that carries a run's tag."""

    run_id: str
    attempt: int | None  # None: a probe
    pid: int
    create_time: float
    group: int  # its process group
    leader: bool  # it leads its session: what the daemon started, not something that started
    name: str = ""  # its program's name, to say what was killed


class Identified(Protocol):
    """A process by its pid and its start time (a pid is reused; the pair is not)."""

    @property
    def pid(self) -> int: ...

    @property
    def create_time(self) -> float: ...


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit code, a signal, or neither when it was not our child."""

    code: int | None
    signal: int | None

    @property
    def known(self) -> bool:
        return self.code is not None or self.signal is not None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        if self.code is not None:
            return f"exit code {self.code}"
        return "exit status unknown (re-adopted process)"


def or_recorded(status: ExitStatus, exit_file: Path) -> ExitStatus:
    """`status`, or when it is unknown (a process that was not this daemon's child) how the
    program ended as its exit-status recorder wrote it to `exit_file`: then classified as a
    child's would be. Unknown still when there is no valid record (the recorder was killed with
    its program, or an older gpuwarden started the attempt without one)."""
    if status.known:
        return status
    found = read_status(str(exit_file))
    return status if found is None else ExitStatus(code=found[0], signal=found[1])


class Child:
    """An attempt's process: spawned by this daemon, or re-adopted from a previous one."""

    def __init__(self, pid: int, create_time: float, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.create_time = create_time
        self.popen = popen

    @property
    def adopted(self) -> bool:
        return self.popen is None

    def poll(self) -> ExitStatus | None:
        """None while running, else how it ended (unknown code/signal for adopted processes)."""
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is None:
                return None
            return ExitStatus(code=None, signal=-rc) if rc < 0 else ExitStatus(code=rc, signal=None)
        return None if process_alive(self.pid, self.create_time) else ExitStatus(code=None, signal=None)

    def group_alive(self) -> bool:
        """Whether any process of the attempt's process group remains."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal_group(self, sig: int) -> bool:
        """Send `sig` to the whole process group (grandchildren included); False if none is left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def signal_tree(self, sig: int) -> bool:
        """Send `sig` to the process group and to every group a descendant leads; False if none
        is left.

        torchrun starts each rank in a session of its own, so the group of a gang's torchrun does
        not hold its ranks. The descendants are listed before anything is signalled: once
        torchrun is gone its ranks are no longer its children.
        """
        groups = [self.pid]
        if process_alive(self.pid, self.create_time):
            try:
                descendants = psutil.Process(self.pid).children(recursive=True)
            except psutil.Error:
                descendants = []
            for proc in descendants:
                try:
                    groups.append(os.getpgid(proc.pid))
                except ProcessLookupError:
                    continue
        sent = False
        for group in dict.fromkeys(groups):
            try:
                os.killpg(group, sig)
                sent = True
            except ProcessLookupError:
                continue
        return sent


def process_alive(pid: int, create_time: float | None) -> bool:
    """True when `pid` runs and is the same process (same create time), not a zombie."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def open_log(path: Path) -> int:
    """An append-only descriptor for a child's stdout/stderr file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def in_own_scope(argv: list[str], unit: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Under systemd, `argv` started in a transient scope of its own.

    The daemon's unit uses KillMode=mixed: on stop, and before a restart after a crash, systemd
    SIGKILLs what is left in the daemon's cgroup. A run in that cgroup would die with the daemon.
    `systemd-run --scope` moves the process into its own scope and then execs the command, so the
    pid the daemon watches is the run's own. Outside systemd (no INVOCATION_ID) nothing changes.
    """
    environ = os.environ if environ is None else environ
    systemd_run = shutil.which("systemd-run", path=environ.get("PATH"))
    if not environ.get("INVOCATION_ID") or systemd_run is None:
        return argv
    return [systemd_run, "--user", "--scope", "--quiet", "--collect", f"--unit={unit}", "--", *argv]


def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: Path | None,
    stdout_path: Path,
    stderr_path: Path,
    memory_limit: int | None = None,
    scope_unit: str | None = None,
    exit_file: Path | None = None,
    umask: int | None = None,
    stdin_pipe: bool = False,
) -> Child:
    """Start `argv` (no shell) in a new session; raises OSError when it cannot be started.
    `umask`: the program's (None: this process's own). `stdin_pipe`: its input is a pipe from
    this process (`Child.popen.stdin`), else nothing.

    With `exit_file`, through the exit-status recorder (`core/exit_record.py`), which writes how
    the program ended there: a later daemon, not its parent, reads it from that file. The
    recorder stays outside the address-space limit: recorder → limit wrapper → program.
    """
    program = argv[0]
    if memory_limit is not None:
        # A tiny exec wrapper sets RLIMIT_AS in the child: preexec_fn is unsafe in a threaded daemon.
        argv = limited_argv(argv, int(memory_limit))
    if exit_file is not None:
        argv = recorded_argv(argv, str(exit_file))
    if argv[0] != program:
        check_startable(program, env, cwd)
    if scope_unit is not None:
        scoped = in_own_scope(argv, scope_unit)
        if scoped is not argv:
            # systemd-run reaches the user's service manager through these; a run submitted from
            # a shell without them (`sudo -u`, some SSH sessions) takes the daemon's.
            env = {**{k: os.environ[k] for k in SYSTEMD_BUS if k in os.environ}, **env}
        argv = scoped
    out_fd = open_log(stdout_path)
    err_fd = open_log(stderr_path)
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            env=env,
            cwd=str(cwd) if cwd is not None else None,
            start_new_session=True,
            close_fds=True,
            umask=-1 if umask is None else umask,
        )
    finally:
        os.close(out_fd)
        os.close(err_fd)
    try:
        create_time = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    return Child(popen.pid, create_time, popen)


def check_startable(program: str, env: Mapping[str, str], cwd: Path | None) -> None:
    """Raise the OSError exec would raise for `program`, before a wrapper starts it: a program
    that cannot start then fails the run at once with the reason, as it does unwrapped (the
    wrapper itself could only exit 127). The wrapper still reports what this cannot foresee."""
    if "/" not in program:
        if shutil.which(program, path=search_path(env.get("PATH", os.defpath), cwd)) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        return
    path = Path(cwd or ".") / program
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if path.is_dir() or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def search_path(path: str, cwd: Path | None) -> str:
    """`path` (a PATH value) with its relative entries, the empty one included, resolved as exec
    resolves them in the run: against the run's working directory, not the daemon's."""
    base = Path(cwd or ".")
    return os.pathsep.join(str(base / entry) for entry in path.split(os.pathsep))


class LocalProcesses:
    """The supervisor's process layer on this machine: real processes, real signals."""

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
    ) -> Child:
        return spawn(argv, env, cwd, stdout_path, stderr_path, memory_limit, scope_unit, exit_file, umask)

    def adopt(self, pid: int, create_time: float) -> Child:
        """A handle on a process a previous daemon started; `poll()` says whether it still runs."""
        return Child(pid, create_time)

    def on_exit(self, child: Identified, callback: Callable[[], None]) -> None:
        pid, create_time = child.pid, child.create_time
        call_on_exit(pid, lambda: process_alive(pid, create_time), callback)

    def tagged(self) -> list[Tagged]:
        """This user's live processes that carry a run tag."""
        found = []
        uid = os.getuid()
        for proc in psutil.process_iter(["uids", "create_time", "name"]):
            try:
                if proc.info["uids"] is None or proc.info["uids"].real != uid:
                    continue
                tag = proc.environ().get(RUN_TAG)
                if tag is None or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                group, leader = os.getpgid(proc.pid), os.getsid(proc.pid) == proc.pid
            except (OSError, psutil.Error):
                continue  # gone meanwhile, or not readable
            run_id, _, number = tag.partition("/")
            attempt = int(number) if number.isdigit() else None
            created, name = float(proc.info["create_time"]), str(proc.info["name"] or "")
            found.append(Tagged(run_id, attempt, proc.pid, created, group, leader, name))
        return found

    def kill(self, processes: Collection[Tagged]) -> None:
        """SIGKILL the process groups of `processes` and wait (bounded) until they are gone."""
        doomed = []
        for tagged in processes:
            try:
                proc = psutil.Process(tagged.pid)
                if abs(proc.create_time() - tagged.create_time) > CREATE_TIME_TOLERANCE_S:
                    continue  # the pid was reused since the scan
                os.killpg(tagged.group, signal.SIGKILL)
                proc.kill()  # also when it has left its group
            except (OSError, psutil.Error):
                continue
            doomed.append(proc)
        psutil.wait_procs(doomed, timeout=KILL_WAIT_S)

    def ranks(self, pid: int) -> dict[int, int]:
        """Rank → pid of the processes torchrun `pid` started, by the RANK torchrun gave each."""
        return gang_ranks(pid)

    def program(self, pid: int) -> int:
        return program_pid(pid)

    def dump_stacks(self, targets: Sequence[DumpTarget]) -> list[StackDump]:
        return dump_stacks(targets)


def gang_ranks(pid: int) -> dict[int, int]:
    """Rank → pid of `pid`'s child processes that carry RANK in their environment (torchrun starts
    each worker as its own child; what a worker starts inherits RANK but is not a rank). `pid`
    may be the exit-status recorder that started torchrun: its ranks are torchrun's."""
    found: dict[int, int] = {}
    try:
        children = psutil.Process(program_pid(pid)).children()
    except psutil.Error:
        return found
    for child in children:
        try:
            rank = child.environ().get("RANK")
            if rank is not None and rank.isdigit() and child.status() != psutil.STATUS_ZOMBIE:
                found[int(rank)] = child.pid
        except (OSError, psutil.Error):
            continue
    return found


def program_pid(pid: int) -> int:
    """The program an attempt's process runs: the only child when `pid` is an exit-status
    recorder, else `pid` itself."""
    try:
        proc = psutil.Process(pid)
        if not is_recorder(proc.cmdline()):
            return pid
        children = proc.children()
    except psutil.Error:
        return pid
    return children[0].pid if len(children) == 1 else pid


# How an attempt ended, as stored in `attempts.classification` (`interrupted`: its process was gone
# after a daemon restart and nothing it wrote says how it ended; `hang`: the hang watchdog stopped
# a gang that made no progress).
Outcome = Literal["succeeded", "failed", "oom", "hang", "stopped", "terminated", "interrupted"]


@dataclass(frozen=True)
class ExitVerdict:
    """The daemon's verdict on an ended attempt, with the one line that says why."""

    outcome: Outcome
    reason: str


def classify(
    status: ExitStatus,
    *,
    stop_requested: bool,
    oom_kills_delta: int | None,
    last_runner_event: str | None,
    runner_codes: bool = True,
) -> ExitVerdict:
    """Decide how an attempt ended from its exit status, the OOM-killer counter and its events.

    `runner_codes`: the exit codes mean what gpuwarden's runners make them mean (3 = out of
    memory, 2 = the spec cannot be met). Not for a user's program, whose `exit 3` is its own.
    A re-adopted process whose exit status was not recorded: its last decisive event decides.
    """
    how = status.describe()
    if stop_requested:
        return ExitVerdict("stopped", f"stopped on request ({how})")
    if last_runner_event == "oom" or (runner_codes and status.code == EXIT_OOM):
        return ExitVerdict("oom", f"out of memory ({how})")
    if status.signal == signal.SIGKILL and oom_kills_delta:
        return ExitVerdict("oom", "killed by the kernel's OOM killer (host memory)")
    if status.code == EXIT_OK:
        return ExitVerdict("succeeded", how)
    if status.code == EXIT_TERMINATED or status.signal == signal.SIGTERM:
        return ExitVerdict("terminated", f"terminated from outside gpuwarden ({how})")
    if runner_codes and status.code == EXIT_USER_ERROR:
        return ExitVerdict("failed", f"the run cannot start as specified ({how})")
    if not status.known:
        if last_runner_event == "finished":
            return ExitVerdict("succeeded", "finished (exit status unknown: process was re-adopted)")
        if last_runner_event == "error":
            return ExitVerdict("failed", "error event (exit status unknown: process was re-adopted)")
        return ExitVerdict("failed", DIED_SILENTLY)
    return ExitVerdict("failed", how)
