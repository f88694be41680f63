"""Exit-status recorder: `python -I exit_record.py STATUS_FILE -- PROGRAM ARGS…` runs
PROGRAM as its child, writes how it ended to STATUS_FILE (`{"code": N}` or `{"signal": N}`, with
the program's `"pid"` and its peak resident set in bytes, `"maxrss"`), then ends the same way.

A daemon restarted while a run goes on is not the run's parent and cannot read its exit status;
the file tells it (as containerd-shim or conmon do for containers). The recorder stays in the
run's process group and forwards nothing: the daemon signals the whole group, so the program
already got the signal, and a second SIGTERM makes some frameworks hard-kill. It starts every
attempt (a user's program, a built-in runner, torchrun), so it imports the standard library
only, and not even pathlib or json (each adds milliseconds to every attempt's start).
"""

from __future__ import annotations

import itertools
import os
import resource
import signal
import sys
from types import FrameType

MODULE = "gpuwarden.core.exit_record"
STATUS_FILE = "exit.json"  # in the attempt's folder
MAX_STATUS_BYTES = 256  # a status is a few bytes; anything longer is not one
EXIT_CANNOT_START = 127  # what a shell answers for a program it cannot run
# Signals that would end the recorder while its program lives. Handlers, not SIG_IGN: an ignored
# disposition survives exec and the program would inherit it; a handler is reset to the default.
SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What Python ignores for itself at start-up; the program gets the defaults, as subprocess does.
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)


# The recorder is started as this file, not as a module: it needs nothing outside the standard
# library, so it runs isolated (`-I`) wherever gpuwarden is installed.
SCRIPT = os.path.abspath(__file__)
SCRIPT_TAIL = os.path.join("", "gpuwarden", "core", "exit_record.py")


def recorded_argv(argv: list[str], status_file: str) -> list[str]:
    """`argv` started through the recorder, its exit status written to `status_file`.

    `-I`: the recorder ignores the run's PYTHONPATH, PYTHONHOME and user site, and its folder is
    not put first on its import path: a user's `resource.py` or `json.py` there cannot replace the
    standard library's in it (the program still gets the run's environment, untouched).
    """
    return [sys.executable, "-I", SCRIPT, status_file, "--", *argv]


def is_recorder(cmdline: list[str]) -> bool:
    """Whether a process's command line is the recorder's: started as this file (from wherever
    gpuwarden was installed when it started), or as a module by an earlier gpuwarden whose runs a
    newer daemon may adopt."""
    pairs = itertools.pairwise(cmdline[1:4])  # the interpreter's own options come first
    return any((a == "-I" and b.endswith(SCRIPT_TAIL)) or (a == "-m" and b == MODULE) for a, b in pairs)


def read_status(path: str) -> tuple[int | None, int | None] | None:
    """(exit code, signal) as recorded in `path`; None when there is no valid record."""
    doc = _valid_record(path)
    if doc is None:
        return None
    return (doc["code"], None) if "code" in doc else (None, doc["signal"])


def read_program_pid(path: str) -> int | None:
    """The pid the program had, from a valid record that names it (an older recorder's does not):
    once the program has ended, the pid a person saw it print, rather than the recorder's."""
    doc = _valid_record(path)
    pid = doc.get("pid") if doc is not None else None
    return pid if pid is not None and pid > 0 else None


def read_peak_rss(path: str) -> int | None:
    """The program's peak resident set in bytes, from a valid record that has it (an older
    recorder's does not)."""
    doc = _valid_record(path)
    peak = doc.get("maxrss") if doc is not None else None
    return peak if peak is not None and peak > 0 else None


def _valid_record(path: str) -> dict[str, int] | None:
    """The record in `path`: one of code or signal (0–255), perhaps the pid and the peak resident
    set; None for anything else."""
    import json  # the daemon's side: the recorder itself never reads a status

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATUS_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_STATUS_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not set(doc) <= {"code", "signal", "pid", "maxrss"}:
        return None
    if any(type(value) is not int for value in doc.values()) or len(set(doc) & {"code", "signal"}) != 1:
        return None
    ends: int = doc["code"] if "code" in doc else doc["signal"]
    return doc if 0 <= ends <= 255 else None


def write_status(path: str, status: dict[str, int]) -> None:
    """Write `status` as JSON so that a reader sees all of it or nothing: a temporary file in the
    same folder, then a rename over `path`."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    text = "{" + ", ".join(f'"{key}": {int(value)}' for key, value in status.items()) + "}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _survive(signum: int, frame: FrameType | None) -> None:
    """The program got the same signal from its group; how it reacts decides what happens."""


def _start(program: list[str], ignored: tuple[int, ...]) -> int:
    """Fork and exec `program` (as subprocess does: posix_spawn would leave glibc's internal
    signals ignored in it); OSError when it cannot be executed."""
    report_r, report_w = os.pipe()  # close-on-exec: empty when the exec succeeded
    pid = os.fork()
    if pid == 0:
        _exec(program, report_w, ignored)
    os.close(report_w)
    failed = os.read(report_r, 16)
    os.close(report_r)
    if failed:
        os.waitpid(pid, 0)
        errno = int(failed)
        raise OSError(errno, os.strerror(errno))
    return pid


def _exec(program: list[str], report: int, ignored: tuple[int, ...]) -> None:
    """In the forked child: the dispositions the recorder was started with back (what Python
    ignores for itself to the default), then the program; never returns."""
    try:
        for sig in (*SURVIVED, *RESTORED):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        os.execvp(program[0], program)
    except OSError as exc:
        os.write(report, str(exc.errno or 0).encode())
    finally:
        os._exit(EXIT_CANNOT_START)


def _wait(pid: int) -> tuple[dict[str, int], int]:
    """How the program ended, and its peak resident set in bytes (the kernel's exact figure, of
    the program or the largest of the processes it waited for)."""
    _, wait_status, usage = os.wait4(pid, 0)  # retried by Python when a handled signal interrupts it
    peak = int(usage.ru_maxrss) * 1024  # Linux counts it in KiB
    if os.WIFSIGNALED(wait_status):
        return {"signal": os.WTERMSIG(wait_status)}, peak
    return {"code": os.waitstatus_to_exitcode(wait_status)}, peak


def _record(path: str, status: dict[str, int]) -> None:
    try:
        write_status(path, status)
    except OSError as exc:
        sys.stderr.write(f"gpuwarden: cannot record the exit status in {path!r}: {exc.strerror}\n")


def _end_like(status: dict[str, int]) -> None:
    """Exit with the program's code, or die of its signal (no core dump of the recorder's own)."""
    sig = status.get("signal")
    if sig is None:
        sys.exit(status["code"])
    sys.stdout.flush()
    sys.stderr.flush()
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their disposition cannot change
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    sys.exit(128 + sig)  # a signal whose default is not to end a process


def main(args: list[str]) -> None:
    """Run the program, record how it ended, end the same way; 127 when it cannot be started."""
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write(f"usage: python -I {SCRIPT} STATUS_FILE -- PROGRAM [ARGS…]\n")
        sys.exit(2)
    path, program = args[0], args[2:]
    # Ignored where the recorder was started (`nohup`, a shell's background job): the program
    # inherits that, as it would started directly.
    ignored = tuple(sig for sig in SURVIVED if signal.getsignal(sig) == signal.SIG_IGN)
    for sig in SURVIVED:
        signal.signal(sig, _survive)
    try:
        pid = _start(program, ignored)
    except OSError as exc:
        _record(path, {"code": EXIT_CANNOT_START})
        sys.stderr.write(f"gpuwarden: cannot start {program[0]!r}: {exc.strerror}\n")
        sys.exit(EXIT_CANNOT_START)
    status, peak = _wait(pid)
    _record(path, {**status, "pid": pid, "maxrss": peak})
    _end_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
