"""The daemon's notifications: one place hears every event the supervisor publishes and every
tick the sampler reads, and turns the ones `notify.events` names into messages.

Hearing costs the publisher a set lookup and, for the few events that make a message, a
`put_nowait` into a bounded queue: the supervisor and the sampler never wait. The
`notifications` thread writes each message (reading the run from the store), applies the per-run
rate limit and hands it to every target's own sender thread (`delivery.py`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.core.config.settings import NotifyEvent, NotifySettings
from gpuwarden.core.notify.gpu_watch import GpuCondition, GpuWatch
from gpuwarden.core.notify.limiter import Held, RateLimit
from gpuwarden.core.notify.notice import Notice
from gpuwarden.core.notify.rules import RunFacts, compose, event_kind, gpu_notice
from gpuwarden.core.telemetry.types import Tick
from gpuwarden.daemon.notify.delivery import Delivery, FailureReport
from gpuwarden.daemon.notify.targets import Target
from gpuwarden.daemon.supervise.ports import Publisher

log = logging.getLogger("gpuwarden.daemon.notify")

INTAKE_SIZE = 1000
FLUSH_EVERY_S = 1.0


@dataclass(frozen=True)
class RunEvent:
    kind: NotifyEvent
    event: dict[str, Any]


class Notifications:
    """Start with `start(targets)`; feed with `offer_event` (any thread) and `offer_tick` (the
    sampler's thread)."""

    def __init__(
        self,
        settings: NotifySettings,
        facts: Callable[[str], RunFacts | None],
        on_failure: FailureReport,
        host: str,
        *,
        gpu_names: Callable[[], Mapping[str, str]] = dict,
        clock: Callable[[], float] = time.time,
        backoff_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.events = frozenset(settings.events)
        self.host = host
        self.facts = facts
        self.on_failure = on_failure
        self.gpu_names = gpu_names
        self.clock = clock
        self.backoff_s = backoff_s
        self.limit = RateLimit(settings.max_per_run, settings.per_minutes * 60)
        self.watch = GpuWatch(settings.idle_minutes * 60, settings.throttle_minutes * 60)
        self.deliveries: list[Delivery] = []
        self.dropped = 0
        self._intake: queue.Queue[RunEvent | GpuCondition] = queue.Queue(maxsize=INTAKE_SIZE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="notifications", daemon=True)

    # -- fed from the daemon's threads (never blocking) -----------------------------------------------

    def offer_event(self, event: Mapping[str, Any]) -> None:
        kind = event_kind(event)
        if kind is not None and kind in self.events:
            self._put(RunEvent(kind, dict(event)))

    def offer_tick(self, tick: Tick, holders: Mapping[str, tuple[str, ...]]) -> None:
        for condition in self.watch.observe(tick.ts, tick.gpus, holders):
            if condition.kind in self.events:
                self._put(condition)

    def _put(self, item: RunEvent | GpuCondition) -> None:
        try:
            self._intake.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("notifications are %d behind: %d events dropped", INTAKE_SIZE, self.dropped)

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, targets: list[Target]) -> None:
        self.deliveries = [
            Delivery(t, self.settings.retries, self.on_failure, backoff_s=self.backoff_s) for t in targets
        ]
        for delivery in self.deliveries:
            delivery.start()
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Write what was heard and send it, within `timeout` s in all (see `Delivery.stop`)."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for delivery in self.deliveries:
            delivery.stop(max(0.0, deadline - time.monotonic()))

    # -- the notifications thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        next_flush = time.monotonic() + FLUSH_EVERY_S
        while not (self._stop.is_set() and self._intake.empty()):
            try:
                item = self._intake.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            try:
                if item is not None:
                    self._handle(item)
                if time.monotonic() >= next_flush:
                    next_flush = time.monotonic() + FLUSH_EVERY_S
                    for held in self.limit.due(self.clock()):
                        self._send(self._held_notice(held))
            except Exception:  # a bug writing one message: that message is lost, not the rest
                log.exception("writing a notification failed")

    def _handle(self, item: RunEvent | GpuCondition) -> None:
        if isinstance(item, RunEvent):
            run_id = str(item.event.get("run_id"))
            facts = self.facts(run_id) or RunFacts(run_id, run_id)
            self._limited(compose(item.kind, item.event, facts, self.host))
            return
        gpu = self.gpu_names().get(item.uuid, item.uuid)
        known = [run for run in map(self.facts, item.runs) if run is not None]
        runs: list[RunFacts | None] = [*known] or [None]
        for run in runs:
            self._limited(gpu_notice(item, gpu, run, self.host))

    def _limited(self, notice: Notice) -> None:
        key = notice.run_id or f"gpu {notice.gpu}"
        send, held = self.limit.admit(key, notice.event, self.clock())
        if send:
            self._send(notice if held is None else notice.with_body(f"{notice.body}\n\n({held.line()})"))

    def _held_notice(self, held: Held) -> Notice:
        """The summary of what the rate limit held back for a run (or a GPU no run holds)."""
        facts = None if held.run_id.startswith("gpu ") else self.facts(held.run_id)
        name = facts.name if facts is not None else held.run_id
        who = f"run {name} ({held.run_id})" if facts is not None else held.run_id
        body = (
            f"{held.total} more notifications about {who} on {self.host} were held back by the "
            f"rate limit: {held.kinds()}."
        )
        run_id, run_name = (held.run_id, name) if facts is not None else (None, None)
        title = f"{name}: {held.total} more notifications"
        return Notice("held", title, body, self.host, self.clock(), run_id, run_name, details=held.counts)

    def _send(self, notice: Notice) -> None:
        for delivery in self.deliveries:
            delivery.put(notice)


class NotifyingPublisher:
    """The supervisor's publisher: the live stream, and notifications beside it."""

    def __init__(self, inner: Publisher, notifications: Notifications) -> None:
        self.inner = inner
        self.notifications = notifications

    def publish(self, kind: str, data: dict[str, Any], run_id: str | None = None) -> None:
        self.inner.publish(kind, data, run_id)
        if kind == "event":
            self.notifications.offer_event(data)
