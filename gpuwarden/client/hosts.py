"""Several hosts' daemons at once: each reached on its own (the local socket, or an ssh tunnel),
kept while it works, opened again after it broke, and asked in parallel threads so that a host
that is down costs its own line and never the others' answers.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from gpuwarden.client.api import ApiClient, default_socket
from gpuwarden.client.remote_sockets import RemoteSockets
from gpuwarden.client.ssh_forward import SshCommand, SshTunnel
from gpuwarden.core.config.hosts import LOCAL_NAMES
from gpuwarden.core.errors import UserError
from gpuwarden.core.private import make_dirs

T = TypeVar("T")
NO_DAEMON = "no gpuwarden daemon — start it there with `gpuwarden up`"
# Unix socket paths are limited to 107 bytes; a longer runtime folder gets a private /tmp one.
_SOCKET_ROOM = 90
# A host that failed is tried again after this long, not on every refresh of a dashboard.
RETRY_AFTER_S = 3.0


@dataclass(frozen=True)
class HostAnswer(Generic[T]):
    """What one host answered: its value, or the one line saying why it could not."""

    host: str
    value: T | None = None
    error: str | None = None
    code: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class HostLink:
    """One host's daemon: an ApiClient on its socket (local) or on a tunnel's local socket."""

    def __init__(
        self, name: str, ssh: SshCommand, folder: Callable[[], Path], remembered: Callable[[], RemoteSockets]
    ) -> None:
        self.name = name
        self._remembered = remembered
        self.local = name in LOCAL_NAMES
        self._ssh = ssh
        self._folder = folder
        self._tunnel: SshTunnel | None = None
        self._client: ApiClient | None = None
        self._failed: tuple[float, UserError] | None = None
        self._closed = False
        self._lock = threading.Lock()

    def call(self, fn: Callable[[ApiClient], T]) -> T:
        """`fn` on this host's client, opening it first; UserError in the host's words. Only the
        opening is serialised: a long call (a live stream) leaves the client to the others."""
        with self._lock:
            client = self._open()
        try:
            return fn(client)
        except UserError as exc:
            with self._lock:
                raise self._judge(exc, client) from None

    def _open(self) -> ApiClient:
        if self._client is not None:
            return self._client
        if self._closed:  # a late call from a thread of a dashboard that is closing
            raise UserError("closed", code="closed")
        if self._failed is not None and time.monotonic() - self._failed[0] < RETRY_AFTER_S:
            raise self._failed[1]
        try:
            if self.local:
                self._client = ApiClient(default_socket(), timeout=self._ssh.read_timeout_s)
                self._client.check_version()
            else:
                self._client = self._through_tunnel()
        except UserError as exc:
            self._reset()
            error = self._judge(exc, None)
            self._failed = (time.monotonic(), error)
            raise error from None
        self._failed = None
        return self._client

    def _through_tunnel(self) -> ApiClient:
        """A client on a new tunnel to the host's daemon, at the socket remembered from last time
        when there is one (asked again when no daemon answers there)."""
        remembered = self._remembered()
        guess = remembered.get(self.name)
        self._tunnel = SshTunnel(self.name, self._ssh, self._folder())
        self._client = ApiClient(self._tunnel.open(guess), timeout=self._ssh.read_timeout_s)
        try:
            self._client.check_version()
        except UserError as exc:
            if guess is None or exc.code not in ("not_running", "transport"):
                raise
            if self._tunnel.ask_again() == guess:
                raise
            self._client.check_version()
        remembered.put(self.name, self._tunnel.remote)
        return self._client

    def _judge(self, exc: UserError, client: ApiClient | None) -> UserError:
        """A failure through the tunnel in this host's terms; a broken link (`client`, unless
        another call replaced it already) is dropped, to be opened again on the next call."""
        if exc.code in ("not_running", "transport", "timeout", "api_version") and client is self._client:
            self._reset()
        if self.local or exc.code not in ("not_running", "transport", "api_version"):
            return exc
        if exc.code == "api_version":
            return UserError(
                f"its daemon speaks another gpuwarden API ({exc}) — install the same gpuwarden there",
                code="api_version",
            )
        return UserError(NO_DAEMON, code="not_running")

    def _reset(self) -> None:
        client, self._client = self._client, None
        tunnel, self._tunnel = self._tunnel, None
        if client is not None:
            client.close()
        if tunnel is not None:
            tunnel.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._reset()


class Fleet:
    """The hosts named, each asked on a thread of its own. Close it (or use `with`) to end the
    ssh processes it started."""

    def __init__(self, names: Sequence[str], ssh: SshCommand, runtime_dir: Path) -> None:
        if not names:
            raise UserError(
                "no hosts given — name them with --host, or list them under `hosts:` in the config"
            )
        self._runtime_dir = runtime_dir
        self._folder: Path | None = None
        self._folder_lock = threading.Lock()
        self._own_folder = False
        self.links = [HostLink(name, ssh, self._tunnel_folder, self._remote_sockets) for name in names]
        self._pool = ThreadPoolExecutor(max_workers=len(self.links), thread_name_prefix="host")
        self._busy: dict[str, Future[object]] = {}
        self._closed = False

    @property
    def names(self) -> list[str]:
        return [link.name for link in self.links]

    def each(self, fn: Callable[[ApiClient], T], wait_s: float | None = None) -> list[HostAnswer[T]]:
        """`fn` on every host at once, in the hosts' order. With `wait_s`, a host still busy after
        it (or still busy with the last call) answers "no answer yet" and is left to finish."""
        return self.each_named(lambda _name, client: fn(client), wait_s)

    def each_named(
        self, fn: Callable[[str, ApiClient], T], wait_s: float | None = None
    ) -> list[HostAnswer[T]]:
        """`each`, with `fn` told which host it reads."""
        futures: dict[str, Future[object] | None] = {}
        for link in self.links:
            previous = self._busy.get(link.name)
            if previous is not None and not previous.done():
                futures[link.name] = None
                continue
            try:
                future: Future[object] = self._pool.submit(functools.partial(_named_call, link, fn))
            except RuntimeError:  # closed meanwhile (the pool takes no more work)
                return [HostAnswer(link.name, error="closed", code="closed") for link in self.links]
            futures[link.name] = self._busy[link.name] = future
        wait_futures([f for f in futures.values() if f is not None], timeout=wait_s)
        return [_answer(name, future) for name, future in futures.items()]

    def _tunnel_folder(self) -> Path:
        """Where the tunnels' sockets go: the user's private runtime folder."""
        with self._folder_lock:
            if self._folder is None:
                folder = self._runtime_dir / "ssh"
                if len(str(folder)) > _SOCKET_ROOM:
                    folder, self._own_folder = Path(tempfile.mkdtemp(prefix="gw-ssh-")), True
                make_dirs(folder)
                self._folder = folder
            return self._folder

    def _remote_sockets(self) -> RemoteSockets:
        return RemoteSockets(self._tunnel_folder() / "sockets.json")

    def close(self) -> None:
        self._closed = True
        for link in self.links:
            link.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._own_folder and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _named_call(link: HostLink, fn: Callable[[str, ApiClient], T]) -> T:
    return link.call(lambda client: fn(link.name, client))


def _answer(name: str, future: Future[object] | None) -> HostAnswer[T]:
    if future is None or not future.done():
        return HostAnswer(name, error="no answer yet (still connecting)", code="waiting")
    with contextlib.suppress(UserError):
        return HostAnswer(name, value=future.result())  # type: ignore[arg-type]
    exc = future.exception()
    assert isinstance(exc, UserError)
    return HostAnswer(name, error=exc.message, code=exc.code)
