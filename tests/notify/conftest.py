"""Real receivers on 127.0.0.1 for notifications: one that takes apprise's json:// posts, one that
accepts connections and never answers, and a port nothing listens on."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon.conftest import daemon_factory, short_tmp  # noqa: F401  (fixtures used by name)


class Receiver:
    """An HTTP server in a thread, on a random port, keeping every JSON body posted to it."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        received = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """Accepts connections (the kernel's backlog does) and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    s = Silent()
    yield s
    s.close()


@pytest.fixture
def refused_url() -> str:
    """A json:// URL whose port nothing listens on (taken, then freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"json://127.0.0.1:{port}/hook"
