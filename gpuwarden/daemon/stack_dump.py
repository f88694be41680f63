"""Dumping the Python stacks of a hung gang's ranks, without stopping them.

`py-spy dump --pid` where py-spy is installed and may read the process (ptrace rules allow it);
else SIGUSR1 to a process that catches it — gpuwarden's runners answer it with a faulthandler
dump of every thread to their stderr (torchrun's per-rank stderr.log), which is read back from
where the file ended before the signal. A process that does not catch SIGUSR1 (a user's script
without a handler) is not signalled: SIGUSR1's default action would kill it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PY_SPY_TIMEOUT_S = 10.0
SIGNAL_DUMP_WAIT_S = 2.0  # faulthandler writes from the signal handler: milliseconds in practice
SETTLE_S = 0.1  # a dump is complete once its file stopped growing this long
MAX_DUMP_BYTES = 256 * 1024


@dataclass(frozen=True)
class DumpTarget:
    """One rank to dump: its process, and the log its SIGUSR1 dump goes to (None: unknown)."""

    rank: int
    pid: int
    stderr: Path | None


@dataclass(frozen=True)
class StackDump:
    """One rank's dump: how it was taken (`py-spy`, `SIGUSR1`, `none`) and the text, or why none."""

    rank: int
    pid: int
    how: str
    text: str | None
    note: str = ""


def catches(pid: int, sig: int) -> bool:
    """Whether `pid` has a handler for `sig` (Linux: SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _py_spy(py_spy: str, pid: int) -> str | None:
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)], capture_output=True, timeout=PY_SPY_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.decode("utf-8", "replace")
    return text if done.returncode == 0 and text.strip() else None


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read(MAX_DUMP_BYTES).decode("utf-8", "replace")


def _by_signal(targets: Sequence[DumpTarget]) -> list[StackDump]:
    """SIGUSR1 to every target at once, then read what each wrote after its file's old end."""
    before = {t.rank: _size(t.stderr) for t in targets}
    sent = []
    for t in targets:
        try:
            os.kill(t.pid, signal.SIGUSR1)
            sent.append(t)
        except OSError:
            continue
    deadline = time.monotonic() + SIGNAL_DUMP_WAIT_S
    sizes = {t.rank: before[t.rank] for t in sent}
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = {t.rank: _size(t.stderr) for t in sent}
        if all(now[r] > before[r] for r in now) and now == sizes:
            break  # every dump is written and no file still grows
        sizes = now
    out = []
    for t in targets:
        if t not in sent or t.stderr is None or _size(t.stderr) <= before[t.rank]:
            out.append(StackDump(t.rank, t.pid, "SIGUSR1", None, "nothing written after SIGUSR1"))
            continue
        out.append(StackDump(t.rank, t.pid, "SIGUSR1", _read_from(t.stderr, before[t.rank])))
    return out


def dump_stacks(targets: Sequence[DumpTarget], py_spy: str | None = None) -> list[StackDump]:
    """Every target's stacks, by py-spy where it works, else by SIGUSR1 where it is caught."""
    py_spy = py_spy if py_spy is not None else shutil.which("py-spy")
    done: list[StackDump] = []
    rest: list[DumpTarget] = []
    for t in targets:
        text = _py_spy(py_spy, t.pid) if py_spy else None
        if text is not None:
            done.append(StackDump(t.rank, t.pid, "py-spy", text))
        elif catches(t.pid, signal.SIGUSR1):
            rest.append(t)
        else:
            why = "py-spy is not installed" if not py_spy else "py-spy could not read it"
            done.append(StackDump(t.rank, t.pid, "none", None, f"{why}, and it does not catch SIGUSR1"))
    done += _by_signal(rest) if rest else []
    return sorted(done, key=lambda d: d.rank)
