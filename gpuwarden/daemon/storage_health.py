"""The daemon's storage as it last found it: the fault that stops its writes now, if any.

A full disk, a read-only mount, an immutable file under the state: the machine's problem, with a
fix the user can make, never a traceback. While it lasts `/v1/health` says `degraded` with it in
one line; the log says it once when it starts, again at growing intervals while it lasts (a write
is refused at every tick), and once when it is over. Samples that could not be stored are
dropped and counted; run updates wait for it (the supervisor writes them when it can).

A fault of the database ends with the first write it commits; one of a file or folder (a run's
folder) when a look at that path finds nothing wrong any more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.storage_fault import StorageFault, storage_fault, unwritable

log = logging.getLogger("gpuwarden.daemon.storage")

REPEAT_FIRST_S = 60.0
REPEAT_MAX_S = 3600.0
_MEANWHILE = {
    True: "runs go on: samples are dropped and run updates are written once it can be",
    False: "what needs it waits until it can be written",
}


@dataclass
class _Open:
    fault: StorageFault
    database: bool
    since: float
    said: bool  # whether the log told of this one (it tells again of its end only then)
    dropped_before: int


class StorageHealth:
    """Thread-safe: the store writer, the supervisor, the sampler and API handlers report to it."""

    def __init__(self, db: Path, state_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._db, self._state_dir = db, state_dir
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[Path, _Open] = {}
        self._next_say: dict[str, float] = {}  # problem → when the log may repeat it
        self._gap: dict[str, float] = {}
        self.samples_dropped = 0

    def fault_of(self, exc: BaseException) -> StorageFault | None:
        """The storage fault `exc` is, else None (then it is a bug, or the user's input)."""
        return storage_fault(exc, folder=self._state_dir, db=self._db)

    def report(self, exc: BaseException, *, database: bool = False) -> bool:
        """Note `exc` if it is a storage fault (True); False when it is something else."""
        fault = self.fault_of(exc)
        if fault is not None:
            self.failed(fault, database=database)
        return fault is not None

    def failed(self, fault: StorageFault, *, database: bool) -> None:
        with self._lock:
            now = self._clock()
            current = self._open.get(fault.path)
            if current is None or current.fault != fault:
                current = _Open(fault, database, now, False, self.samples_dropped)
                self._open[fault.path] = current
            if now < self._next_say.get(fault.problem, now):
                return
            gap = min(self._gap.get(fault.problem, REPEAT_FIRST_S / 2) * 2, REPEAT_MAX_S)
            self._gap[fault.problem], self._next_say[fault.problem] = gap, now + gap
            if current.said:
                dropped = self.samples_dropped - current.dropped_before
                log.warning(
                    "still %s (for %s; %d samples dropped)", fault.line(), _span(now - current.since), dropped
                )
            else:
                current.said = True
                log.warning("%s; %s", fault.line(), _MEANWHILE[database])

    def dropped_sample(self) -> None:
        with self._lock:
            self.samples_dropped += 1

    def stored(self) -> None:
        """The database committed a write: its fault, if any, is over."""
        if any(o.database for o in self._open.values()):
            with self._lock:
                for path in [p for p, o in self._open.items() if o.database]:
                    self._close(path)

    def recheck(self) -> None:
        """End the faults of files and folders that a look finds writable again."""
        with self._lock:
            files = [(p, o) for p, o in self._open.items() if not o.database]
        for path, current in files:
            if unwritable(current.fault.path) is None:
                with self._lock:
                    self._close(path)

    def _close(self, path: Path) -> None:
        current = self._open.pop(path, None)
        if current is None or not current.said:
            return
        dropped = self.samples_dropped - current.dropped_before
        lost = f"; {dropped} samples were dropped meanwhile" if dropped else ""
        log.info("%s can be written again (after %s)%s", path, _span(self._clock() - current.since), lost)

    @property
    def fault(self) -> str | None:
        """The oldest fault in one line, None when there is none."""
        self.recheck()
        with self._lock:
            faults = sorted(self._open.values(), key=lambda o: o.since)
        if not faults:
            return None
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        return faults[0].fault.line() + more

    @property
    def writable(self) -> bool:
        """No write of the database is refused now."""
        return not any(o.database for o in self._open.values())


def storage_message(fault: StorageFault) -> str:
    """An API answer: the daemon could not do what was asked, why, and the fix."""
    return f"the daemon cannot write {fault.problem} — {fault.fix}, then retry"


def _span(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"
