"""Told when a process ends, as it ends: the supervisor's passes run every fraction of a second,
and an attempt that ends between two of them would wait for the next — each recovery pays that
wait twice (the failed attempt's end, the run's end). A pidfd becomes readable when its process
ends; a thread waiting on it wakes the supervisor at once.

A pidfd only watches: it does not reap, so the attempt's `Popen` still reads its exit status,
and it works for a process a previous daemon started (same user) as well as for a child.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable


def call_on_exit(pid: int, still_it: Callable[[], bool], callback: Callable[[], None]) -> None:
    """Call `callback` (from a thread of its own) once process `pid` has ended; at once when it is
    gone already. `still_it()` says whether `pid` is still the process meant (a pid is reused).
    Never where the machine has no pidfds: the supervisor's passes still see the end, a fraction
    of a second later."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        callback()
        return
    except OSError:
        return  # no pidfds here (an old kernel, a sandbox that refuses the call)
    if not still_it():
        os.close(fd)
        callback()  # ended already, or the pid is another process's now
        return
    threading.Thread(
        target=_wait_then_call, args=(fd, callback), name=f"exit-watch-{pid}", daemon=True
    ).start()


def _wait_then_call(fd: int, callback: Callable[[], None]) -> None:
    try:
        with contextlib.suppress(OSError):
            select.select([fd], [], [])
    finally:
        os.close(fd)
    callback()
