"""ApiClient without a daemon: version check on connect, error mapping, SSE parsing."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from gpuwarden.client import NOT_RUNNING, ApiClient
from gpuwarden.client.sse import parse_sse
from gpuwarden.core.errors import UserError


def _client(handler: httpx.MockTransport) -> ApiClient:
    client = ApiClient(Path("/nonexistent/api.sock"))
    client._client = httpx.Client(transport=handler, base_url="http://gpuwarden")
    return client


def test_client_refuses_a_daemon_with_another_major_api_version() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"api_version": "2.0", "pid": 1})

    with pytest.raises(UserError) as err, _client(httpx.MockTransport(handler)) as client:
        client.runs()
    assert err.value.code == "api_version"
    assert "API v2.0" in str(err.value) and "\n" not in str(err.value)


def test_errors_become_user_errors_with_code_and_problem_lines() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/health":
            return httpx.Response(200, json={"api_version": "1.0"})
        body = {"error": {"code": "invalid_config", "message": "a; b", "problems": ["s:1: a", "s:2: b"]}}
        return httpx.Response(422, json=body)

    with pytest.raises(UserError) as err, _client(httpx.MockTransport(handler)) as client:
        client.submit({"name": "x"})
    assert err.value.code == "invalid_config"
    assert str(err.value).splitlines() == ["s:1: a", "s:2: b"]


def test_answers_are_models_and_a_foreign_shape_is_one_line() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/health":
            return httpx.Response(200, json={"api_version": "1.0"})
        if request.url.path == "/v1/runs/x/logs":
            body = {"data": "hi", "offset": 0, "next_offset": 2, "overflow": False, "size": 2, "eof": True,
                    "attempt": 1, "stream": "stdout"}  # fmt: skip
            return httpx.Response(200, json=body)
        return httpx.Response(200, json={"runs": [{"id": "r1", "state": "sleeping"}]})

    with _client(httpx.MockTransport(handler)) as client:
        chunk = client.logs("x")
        assert (chunk.data, chunk.next_offset, chunk.eof) == ("hi", 2, True)
        with pytest.raises(UserError) as err:
            client.runs()
    assert err.value.code == "api_mismatch"
    assert "GET /v1/runs" in str(err.value) and "runs.0." in str(err.value) and "\n" not in str(err.value)


def test_a_client_closed_by_another_thread_answers_one_line_not_a_traceback() -> None:
    # A dashboard over several hosts closes a host's client when it judges the host down, while
    # that host's stream thread may be about to open its stream again.
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"api_version": "1.0"})

    client = _client(httpx.MockTransport(handler))
    client.check_version()
    client.close()
    with pytest.raises(UserError) as err:
        next(iter(client.stream()))
    assert err.value.code == "closed"
    with pytest.raises(UserError) as err:
        client.runs()
    assert err.value.code == "closed" and "\n" not in str(err.value)


def test_absent_daemon_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err, ApiClient(tmp_path / "api.sock") as client:
        client.health()
    assert str(err.value) == NOT_RUNNING


def test_sse_parser_skips_comments_and_bad_data() -> None:
    text = [
        ": hello",
        "retry: 2000",
        "",
        "id: 1",
        "event: sample",
        'data: {"dropped": 3, "ts": 1}',
        "",
        "event: run",
        "data: not json",
        "",
        "event: event",
        'data: {"type":',
        'data: "x"}',
        "",
    ]
    frames = list(parse_sse(text))
    assert [(f.event, f.id) for f in frames] == [("sample", "1"), ("event", None)]
    assert frames[0].dropped == 3 and frames[1].data == {"type": "x"}


class _ClosingServer:
    """A Unix-socket HTTP server that answers the first request on every connection, keeps it
    alive, then closes it when the next request arrives without answering — what a client sees
    when the daemon's keep-alive timer closes a pooled connection as a request goes out."""

    def __init__(self, path: Path) -> None:
        self.answered: list[str] = []
        self.unanswered: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as reader:
                self.answered.append(self._answer(conn, reader))
                following = reader.readline()
                if following:  # not the client closing its connection
                    self.unanswered.append(_request_line(following))

    def _answer(self, conn: socket.socket, reader: BinaryIO) -> str:
        request = _request_line(reader.readline())
        while reader.readline() not in (b"\r\n", b""):
            pass
        body = b'{"api_version": "1.0"}' if request.endswith("/v1/health") else b'{"runs": []}'
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)
        return request

    def close(self) -> None:
        self._sock.close()


def _request_line(line: bytes) -> str:
    method, target, *_ = line.decode().split()
    return f"{method} {target.split('?')[0]}"


def test_a_read_on_a_connection_the_daemon_just_closed_is_sent_again_but_a_change_is_not(
    short_tmp: Path,
) -> None:
    server = _ClosingServer(short_tmp / "api.sock")
    try:
        with ApiClient(short_tmp / "api.sock") as client:
            assert client.runs() == []  # health on one connection, the runs read on a second
            with pytest.raises(UserError) as err:
                client.stop("r1")  # a change is never sent twice
    finally:
        server.close()
    assert err.value.code == "transport" and "\n" not in str(err.value)
    assert server.answered == ["GET /v1/health", "GET /v1/runs"]
    assert server.unanswered == ["GET /v1/runs", "POST /v1/runs/r1/stop"]


def test_operations_that_take_no_body_are_sent_none() -> None:
    """The daemon refuses a body where an operation takes none: the client never sends one."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/health":
            return httpx.Response(200, json={"api_version": "1.0"})
        sent.append(request)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no run r1"}})

    with _client(httpx.MockTransport(handler)) as client:
        calls = (
            client.shutdown,
            lambda: client.resume("r1"),
            lambda: client.tune("r1"),
            lambda: client.delete("r1"),
            lambda: client.stop("r1"),
            lambda: client.terminate_process(7),
        )
        for call in calls:
            with pytest.raises(UserError):
                call()
    assert len(sent) == len(calls)
    for request in sent:
        framing = (
            request.content,
            request.headers.get("content-length", "0"),
            "transfer-encoding" in request.headers,
        )
        assert framing == (b"", "0", False), (request.method, request.url.path)


@pytest.mark.parametrize("configured", ["nothing", "a config file", "a variable"])
def test_the_default_socket_is_where_the_settings_put_it(
    configured: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without settings that could move it, the socket is found without loading them; with a
    config file or a GPUWARDEN_ variable, they decide. Either way it is where the daemon listens."""
    from gpuwarden.client import default_socket
    from gpuwarden.core.config.settings import load_settings

    for name in [k for k in os.environ if k.startswith("GPUWARDEN_")]:
        monkeypatch.delenv(name)
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    if configured == "a config file":
        (tmp_path / "config" / "gpuwarden").mkdir(parents=True)
        (tmp_path / "config" / "gpuwarden" / "config.yaml").write_text(
            f"paths: {{runtime_dir: {tmp_path}/r}}\n"
        )
    elif configured == "a variable":
        monkeypatch.setenv("GPUWARDEN_PATHS__RUNTIME_DIR", str(tmp_path / "elsewhere"))
    expected = {
        "nothing": tmp_path / "run" / "gpuwarden",
        "a config file": tmp_path / "r",
        "a variable": tmp_path / "elsewhere",
    }
    assert default_socket() == load_settings().resolve_paths().socket
    assert default_socket() == expected[configured] / "api.sock"
