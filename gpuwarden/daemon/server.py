"""uvicorn on a private Unix socket, refusing connections from other users.

uvicorn's own `uds=` binding chmods the socket 0666, so the socket is bound here (umask 077, then
0600, in a 0700 directory) and handed to uvicorn. Peer credentials (SO_PEERCRED) are checked when
a connection is made, before a byte of the request is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import stat
import struct
import threading
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpuwarden.core.errors import UserError
from gpuwarden.daemon.lock import ensure_private_dir

log = logging.getLogger("gpuwarden.daemon.server")

# sun_path holds 108 bytes on Linux, its terminating NUL included.
MAX_SOCKET_PATH = 107
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a Unix socket, or None where unreadable.

    `sock` is a socket.socket or asyncio's TransportSocket wrapper (what transports expose).
    """
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is None or sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, so_peercred, _UCRED.size))
    except OSError:
        return None
    return int(uid)


def _forbidden_response(uid: int) -> bytes:
    body = json.dumps(
        {
            "error": {
                "code": "forbidden",
                "message": f"uid {uid} may not use this gpuwarden daemon (uid {os.getuid()})",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class PeerCheckedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol that answers 403 and closes connections from another uid."""

    refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        uid = peer_uid(transport.get_extra_info("socket"))
        if uid is not None and uid != os.getuid():
            self.refused = True
            log.warning("refused a connection from uid %d", uid)
            transport.write(_forbidden_response(uid))
            transport.close()
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.refused:
            super().connection_lost(exc)


def bind_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600, in a 0700 directory.

    Called with the instance lock held, so anything already at `path` is a dead daemon's socket.
    """
    ensure_private_dir(path.parent)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise UserError(f"{path} exists and is not a socket — remove it, then start the daemon again")
        log.info("removing stale socket %s", path)
        path.unlink()
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UserError(
            f"paths.runtime_dir: the socket's path {path} is {len(os.fsencode(path))} bytes, more than"
            f" the {MAX_SOCKET_PATH} a Unix socket allows — set paths.runtime_dir (or XDG_RUNTIME_DIR)"
            " to a shorter folder"
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


class ApiServer(uvicorn.Server):
    """uvicorn.Server whose signal handling only asks it to exit (the daemon then shuts down in
    order) instead of re-raising the signal afterwards."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        log.info("received %s: shutting down (runs keep running)", signal.Signals(sig).name)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def make_server(app: Any, graceful_timeout: float = 3.0) -> ApiServer:
    """An ApiServer for `app` using the peer-checked protocol and the daemon's own logging."""
    config = uvicorn.Config(
        app,
        http=PeerCheckedH11Protocol,
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(max(1, graceful_timeout)),
        server_header=False,
    )
    return ApiServer(config)
