"""One target's sender thread: its own bounded queue, messages in order, each tried again after
1, 2, 4… s up to `notify.retries` times. A target that hangs or refuses delays only its own
messages: never the supervisor, the sampler or another target."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from gpuwarden.core.notify.notice import Notice
from gpuwarden.daemon.notify.targets import SendFailed, Target

log = logging.getLogger("gpuwarden.daemon.notify")

QUEUE_SIZE = 100
FIRST_BACKOFF_S = 1.0

# (notice, target label, one-line reason, tries): a message the target never took.
FailureReport = Callable[[Notice, str, str, int], None]


class Delivery:
    """`put` never blocks: a full queue (a target down for long, with many messages) drops the
    message and counts it."""

    def __init__(
        self,
        target: Target,
        retries: int,
        on_failure: FailureReport,
        *,
        queue_size: int = QUEUE_SIZE,
        backoff_s: float = FIRST_BACKOFF_S,
    ) -> None:
        self.target = target
        self.retries = retries
        self.on_failure = on_failure
        self.backoff_s = backoff_s
        self.dropped = 0
        self._queue: queue.Queue[Notice] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"notify {target.label}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Send what is queued, once each (no more retries), for up to `timeout` s: a run that
        failed just before `gpuwarden down` is still told. The thread is a daemon thread: a hung
        receiver never holds the daemon's exit."""
        self._stop.set()
        self._thread.join(timeout)

    def put(self, notice: Notice) -> None:
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            self.dropped += 1
            self.on_failure(notice, self.target.label, f"its queue is full ({self._queue.maxsize})", 0)

    def _loop(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                notice = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self.deliver(notice)

    def deliver(self, notice: Notice) -> bool:
        """Send with retries; False (and the failure reported) when every try failed."""
        reason, tries = "not sent", 0
        for attempt in range(self.retries + 1):
            tries += 1
            try:
                self.target.send(notice)
                return True
            except SendFailed as exc:
                reason = str(exc)
            except Exception as exc:  # a target's bug: its message is lost, never the daemon
                log.exception("notification target %s failed", self.target.label)
                reason = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries and self._stop.wait(self.backoff_s * 2**attempt):
                break
        self.on_failure(notice, self.target.label, reason, tries)
        return False
