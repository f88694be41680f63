"""Where a notification goes: an apprise URL, or the user's `notify.on_event` command.

Each target sends one message within its timeout or raises `SendFailed` with one line saying
why; the daemon's sender threads retry and record failures, `gpuwarden notify test` prints them.
apprise is imported only here, only when a URL is configured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
from typing import Any, Protocol
from urllib.parse import urlsplit

from gpuwarden.core.config.settings import NotifySettings
from gpuwarden.core.errors import UserError
from gpuwarden.core.notify.notice import Notice

INSTALL_HINT = "pip install 'gpuwarden[notify]'"


class SendFailed(Exception):
    """One line: why a target did not take a message."""


class Target(Protocol):
    """Something that takes a message: `label` names it without its secrets."""

    @property
    def label(self) -> str: ...

    def send(self, notice: Notice) -> None: ...


def url_label(url: str) -> str:
    """`ntfy://ntfy.sh/…`: the service, host and port, never a token or password in the rest."""
    parts = urlsplit(url)
    port = _port(url)  # None also when it is no number: apprise says what is wrong with it
    host = f"{parts.hostname or ''}{f':{port}' if port else ''}"
    return f"{parts.scheme}://{host}{'/…' if url.rstrip('/') != f'{parts.scheme}://{host}' else ''}"


class AppriseTarget:
    """One apprise URL (ntfy, Slack, Matrix, email, json://…), with apprise's sockets bounded by
    `timeout` (connect and each read)."""

    def __init__(self, url: str, timeout: float) -> None:
        try:
            import apprise
        except ImportError:
            raise UserError(
                f"notify.urls: sending to {url_label(url)} needs apprise, which is not installed — "
                f"{INSTALL_HINT} (or remove notify.urls)"
            ) from None
        self.label = url_label(url)
        self._apprise: Any = apprise  # partly typed: its log capture is not
        # What apprise logs (payloads at debug level) goes to `send`'s capture only: a failure
        # reaches the daemon's log as one line of ours. The level stays at debug: a capture
        # restores the level it found as it ends, which would silence another thread's capture
        # still waiting for its socket's cause.
        apprise_log = logging.getLogger("apprise")
        apprise_log.propagate = False
        apprise_log.setLevel(logging.DEBUG)
        self._sender = apprise.Apprise()
        if not self._sender.add(url):
            raise UserError(
                f"notify.urls: {self.label}: apprise does not understand this URL — check the "
                "service's URL syntax (https://github.com/caronc/apprise/wiki)"
            )
        for server in self._sender:
            server.socket_connect_timeout = timeout
            server.socket_read_timeout = timeout
        parts = urlsplit(url)
        # How requests names this service's connection in its errors: apprise logs every target's
        # sends to one logger, and another sender thread's lines must not explain this one's.
        self._where = f"host='{parts.hostname}'" + (f", port={parts.port}" if _port(url) else "")

    def send(self, notice: Notice) -> None:
        with self._apprise.LogCapture(level=logging.DEBUG, fmt="%(message)s") as said:
            sent = self._sender.notify(title=notice.title, body=notice.body)
        if not sent:
            raise SendFailed(apprise_reason(sent, said.getvalue(), self._where))


def _port(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None


# What a socket error comes down to, inside the long text requests writes for it.
_SOCKET_CAUSE = re.compile(r"(Read timed out[^)]*\)|\[Errno -?\d+\] [^\"')]+|timed out)")


def apprise_reason(result: object, log: str, where: str) -> str:
    """One line: apprise's warning for this send (its result keeps each service's own), and the
    socket's cause from the lines logged about this service's connection (`where`)."""
    said = [
        e.message for r in getattr(result, "results", ()) for e in r.logs() if e.level in ("WARNING", "ERROR")
    ]
    reason = said[-1].rstrip(".") if said else "apprise could not send it"
    lines = [line for line in log.splitlines() if where in line]
    causes = [m.group(1).strip() for line in lines if (m := _SOCKET_CAUSE.search(line))]
    return f"{reason}: {causes[-1]}" if causes else reason


class CommandTarget:
    """The user's command: the message as JSON on stdin and as GPUWARDEN_* variables; killed
    (its whole process group) when it outlives `timeout`."""

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.argv = argv
        self.timeout = timeout
        self.label = f"on_event: {os.path.basename(argv[0])}"

    def send(self, notice: Notice) -> None:
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**os.environ, **notice.environment()},
                start_new_session=True,  # its children die with it on a timeout
            )
        except OSError as exc:
            raise SendFailed(f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        try:
            _, err = proc.communicate(notice.json().encode(), timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            why = f"still running after {self.timeout:g} s (notify.on_event_timeout): killed"
            raise SendFailed(why) from None
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            raise SendFailed(f"exit status {proc.returncode}" + (f": {said[-1][:200]}" if said else ""))


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def build_targets(settings: NotifySettings) -> list[Target]:
    """Every configured target; a URL apprise cannot send to (or apprise missing) is a UserError."""
    targets: list[Target] = [AppriseTarget(url, settings.send_timeout) for url in settings.urls]
    if settings.on_event:
        targets.append(CommandTarget(settings.on_event, settings.on_event_timeout))
    return targets
