"""Notifications as a daemon component: built only when `notify:` names a target, its targets
(apprise with them) loaded as the daemon starts, a message no target took recorded as a
`notify_failed` event of its run and a line in the daemon's log."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from gpuwarden.core.config.settings import NotifySettings
from gpuwarden.core.notify.notice import Notice
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.telemetry.types import GpuStatic, Tick
from gpuwarden.daemon.notify.notifications import Notifications, NotifyingPublisher
from gpuwarden.daemon.notify.run_facts import StoreFacts
from gpuwarden.daemon.notify.targets import build_targets
from gpuwarden.daemon.supervise.ports import Publisher, Store

log = logging.getLogger("gpuwarden.daemon.notify")


class NotifyComponent:
    """`publisher(inner)` is what the supervisor publishes through; `on_tick` is the sampler's
    listener; `holders` says which runs hold each GPU (the supervisor's watched attempts)."""

    def __init__(
        self,
        settings: NotifySettings,
        db_path: Path,
        writer: Store,
        stream: Publisher,
        gpus: Callable[[], list[GpuStatic]],
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.stream = stream
        self.holders: Callable[[], Mapping[str, tuple[str, ...]]] = dict
        self.notifications = Notifications(
            settings,
            StoreFacts(db_path),
            self.record_failure,
            socket.gethostname(),
            gpu_names=lambda: {g.uuid: f"{g.index} ({g.uuid})" for g in gpus()},
        )

    def publisher(self, inner: Publisher) -> Publisher:
        return NotifyingPublisher(inner, self.notifications)

    def on_tick(self, tick: Tick) -> None:
        self.notifications.offer_tick(tick, self.holders())

    def start(self) -> None:
        targets = build_targets(self.settings)
        self.notifications.start(targets)
        log.info("notifications to %s", ", ".join(t.label for t in targets))

    def stop(self) -> None:
        self.notifications.stop()

    def record_failure(self, notice: Notice, target: str, reason: str, tries: int) -> None:
        """A message a target never took: a line in the log, and an event of its run (shown by
        `gpuwarden events RUN`). Runs on a sender thread: a store that refuses is only logged."""
        after = f" after {tries} tries" if tries > 1 else ""
        log.warning("notification %r to %s failed%s: %s", notice.title, target, after, reason)
        run_id = notice.run_id
        if run_id is None:
            return
        payload = {"target": target, "event": notice.event, "reason": reason, "tries": tries}

        def write(db: sqlite_utils.Database) -> dict[str, object] | None:
            store = RunStore(db)
            if store.get_run(run_id) is None:
                return None  # removed meanwhile
            return store.add_daemon_event(run_id, notice.attempt, "notify_failed", payload)

        try:
            stored = self.writer.call(write)
        except Exception as exc:
            log.warning("could not record the failed notification of run %s: %s", run_id, exc)
            return
        if stored is not None:
            self.stream.publish("event", {"run_id": run_id, **stored}, run_id)
