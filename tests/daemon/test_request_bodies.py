"""Request bodies as a hostile client sends them: over the cap, declared or in chunks, and sent
to operations that take none (which must refuse them rather than act)."""

from __future__ import annotations

import json
import re
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.daemon.conftest import DaemonHandle, command_spec

NESTED = "[" * 100_000 + "]" * 100_000


def _send_huge(sock_path: Path, target: str, size: int, chunked: bool) -> tuple[int, dict[str, Any]]:
    """Send `size` bytes as the body of `target` ("POST /v1/runs"), sending until the daemon
    answers; its status and body."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sock_path))
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    sock.sendall(
        f"{target} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode()
    )
    piece = b"[" * (1 << 20)
    if chunked:
        piece = b"%x\r\n%s\r\n" % (len(piece), piece)
    sent, data = 0, b""
    while b"\r\n\r\n" not in data:
        readable, writable, _ = select.select([sock], [sock] if sent < size else [], [], 30)
        assert readable or writable, "the daemon neither read nor answered for 30 s"
        if readable:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        elif writable:
            try:
                sent += sock.send(piece)
            except (BrokenPipeError, ConnectionResetError):
                sent = size  # it stopped reading: the answer is on its way
    sock.settimeout(30)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    sock.close()
    return int(head.split()[1]), json.loads(body)


def test_oversized_bodies_are_refused_before_they_are_read(gw: DaemonHandle) -> None:
    """Eight 50 MB posts, declared or sent in chunks: each is a 413 naming the limit, and the
    daemon's memory does not grow by what was sent."""
    assert gw.proc is not None
    daemon = psutil.Process(gw.proc.pid)
    with gw.client() as client:
        client.health()
    before = daemon.memory_info().rss
    for chunked in (False, True) * 4:
        status, body = _send_huge(gw.socket, "POST /v1/runs", 50 << 20, chunked)
        assert status == 413, body
        assert body["error"] == {
            "code": "too_large",
            "message": "the request body is larger than 4 MiB, the most the API reads: send a smaller spec",
        }
    grown = daemon.memory_info().rss - before
    assert grown < 30 << 20, f"the daemon grew by {grown >> 20} MiB"
    with gw.client() as client:
        assert client.health().pid == gw.proc.pid


def _bodies() -> Iterator[dict[str, Any]]:
    """A body as httpx sends it: small, nested 100 000 deep, and in chunks of unknown length."""
    yield {"json": {}}
    yield {"content": NESTED, "headers": {"content-type": "application/json"}}
    yield {"content": iter([b"{", b"}"])}


def test_a_body_sent_to_an_operation_that_takes_none_is_refused_and_nothing_is_done(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("failing", "raise SystemExit(3)"))
    assert gw.wait_state(run["id"])["state"] == "failed"
    targets = [
        ("POST", f"/v1/runs/{run['id']}/resume"),
        ("POST", f"/v1/runs/{run['id']}/tune"),
        ("DELETE", f"/v1/runs/{run['id']}"),
        ("GET", "/v1/health"),
        ("POST", "/v1/shutdown"),
    ]
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        for method, path in targets:
            for body in _bodies():
                answer = http.request(method, path, **body)
                assert answer.status_code == 413, (method, path, answer.text)
                assert answer.json()["error"] == {
                    "code": "unexpected_body",
                    "message": f"{method} {path} takes no request body: send the request without one",
                }
    with gw.client() as client:  # the daemon is up, and the run neither resumed, tuned nor removed
        assert gw.proc is not None and client.health().pid == gw.proc.pid
        after = client.run(run["id"])
        assert (after.state, len(after.attempts), after.spec.get("autotune")) == ("failed", 1, False)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        # No body, even one declared empty, is what the operation takes.
        resumed = http.post(f"/v1/runs/{run['id']}/resume", content=b"")
        assert resumed.status_code == 200 and resumed.request.headers["content-length"] == "0", resumed.text


def test_a_shutdown_sent_50_mb_is_refused_and_the_daemon_stays_up(gw: DaemonHandle) -> None:
    assert gw.proc is not None
    daemon = psutil.Process(gw.proc.pid)
    before = daemon.memory_info().rss
    for chunked in (True, False, True):
        status, body = _send_huge(gw.socket, "POST /v1/shutdown", 50 << 20, chunked)
        assert (status, body["error"]["code"]) == (413, "unexpected_body"), body
    grown = daemon.memory_info().rss - before
    assert grown < 30 << 20, f"the daemon grew by {grown >> 20} MiB"
    with gw.client() as client:
        assert client.health().pid == gw.proc.pid
