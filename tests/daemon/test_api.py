"""The API as clients meet it: socket permissions, foreign users, error shapes, SSE, fuzzing."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gpuwarden.client import StreamFrame
from gpuwarden.core.errors import UserError
from gpuwarden.daemon.http import create_app
from tests.daemon.conftest import DaemonHandle, command_spec


def test_socket_is_0600_in_a_0700_directory(gw: DaemonHandle) -> None:
    mode = gw.socket.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(gw.runtime_dir.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another uid (65534)")
def test_connection_from_another_uid_is_refused(gw: DaemonHandle) -> None:
    # The socket is 0600: open the directory and socket to everyone for this test only, so the
    # refusal tested is the peer-credential check, not the file mode.
    os.chmod(gw.runtime_dir.parent, 0o755)
    os.chmod(gw.runtime_dir, 0o755)
    os.chmod(gw.socket, 0o666)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody, connect, report what came back
        os.close(read_fd)
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            sock.connect(str(gw.socket))
            # The daemon answers a foreign peer at once; only a daemon that accepted us would wait
            # for the request.
            try:
                data = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                data = b""
            while chunk := sock.recv(65536):
                data += chunk
            os.write(write_fd, data[:4000] or b"<empty>")
        except BaseException as exc:  # report anything to the parent
            os.write(write_fd, f"<error {exc!r}>".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as fh:
        reply = fh.read().decode(errors="replace")
    assert reply.startswith("HTTP/1.1 403"), reply
    body = json.loads(reply.split("\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "forbidden"
    assert "refused a connection from uid 65534" in gw.log.read_text()
    with gw.client() as client:  # the owner still gets in
        assert client.health().pid > 0


def test_stale_socket_from_a_dead_daemon_is_replaced(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    gw.kill9()
    assert gw.socket.exists()
    gw.start()
    with gw.client() as client:
        assert client.health().pid == gw.proc.pid  # type: ignore[union-attr]


def test_health_and_telemetry_endpoints(gw: DaemonHandle) -> None:
    with gw.client() as client:
        health = client.health()
        assert health.api_version.startswith("1.")
        assert health.gpu_status.startswith("2 GPUs")
        assert health.db.endswith("gpuwarden.db")
        gpus = client.gpus().gpus
        assert len(gpus) == 2 and all(g.sample is not None for g in gpus)
        host = client.host().host
        assert host is not None and host.mem_total
        gw.wait_samples(2)
        hist = client.history(window="5m", metrics=["util_gpu", "mem_used"], points=10)
        assert set(hist.series) == {g.uuid for g in gpus}
        assert client.history(window="5m", host=True, metrics=["cpu_percent"]).series
        assert isinstance(client.processes(), list)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        openapi = http.get("/v1/openapi.json").json()
    assert {"/v1/health", "/v1/runs", "/v1/runs/{ref}/logs", "/v1/stream"} <= set(openapi["paths"])


def test_openapi_documents_every_answer() -> None:
    doc = create_app(cast(Any, None)).openapi()
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            ok = next(body for status, body in op["responses"].items() if status.startswith("2"))
            content = ok.get("content", {})
            if path == "/v1/stream":
                continue
            schema = content["application/json"]["schema"]
            assert "$ref" in schema or "anyOf" in schema, (method, path, schema)


def _send_get(path: str, sock_path: Path) -> socket.socket:
    """A GET written whole to its own connection (so it reaches the daemon before what follows)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(sock_path))
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n".encode())
    return sock


def _read_answer(sock: socket.socket) -> tuple[int, Any]:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_long_polls_wait_without_holding_a_worker(gw: DaemonHandle) -> None:
    """More waiting requests than the server has worker threads (40): a plain request sent after
    them is answered while they wait, and they all wake when the run changes."""
    run = gw.submit(command_spec("quiet", "import time; time.sleep(120)"))
    gw.wait_state(run["id"], ("running",))
    with gw.client() as client:
        since = client.events(run["id"]).next_since
        size = client.logs(run["id"]).size
    base = f"/v1/runs/{run['id']}"
    polls = [_send_get(f"{base}/events?since={since}&wait=30", gw.socket) for _ in range(30)]
    polls += [_send_get(f"{base}/logs?offset={size}&wait=30", gw.socket) for _ in range(30)]
    with gw.client(timeout=60) as client:
        started = time.monotonic()
        client.health()
        # Workers sleeping in the polls would hold this answer until their wait (30 s) ran out.
        assert time.monotonic() - started < 20
        client.stop(run["id"], grace_seconds=0)
    answers = [_read_answer(sock) for sock in polls]
    assert all(status == 200 for status, _ in answers)
    assert all(page["events"] and page["events"][0]["id"] > since for _, page in answers[:30])
    assert all(chunk["eof"] for _, chunk in answers[30:])


ERROR_CASES = [
    ("GET", "/v1/runs/nope", None, 404, "not_found"),
    ("GET", "/v1/nothing", None, 404, "not_found"),
    ("DELETE", "/v1/health", None, 405, "method_not_allowed"),
    ("GET", "/v1/history?points=0", None, 422, "invalid_request"),
    ("GET", "/v1/history?window=soon", None, 400, "bad_input"),
    ("GET", "/v1/history?metric=bogus", None, 400, "bad_input"),
    ("POST", "/v1/runs", {"spec": {"name": "x"}}, 422, "invalid_config"),
    ("POST", "/v1/runs", {"spec_yaml": "name: [", "label": "s.yaml"}, 400, "bad_input"),
    ("POST", "/v1/runs", {"spec_yaml": "name: x\nkind: command\n", "label": "s.yaml"}, 422, "invalid_config"),
    ("POST", "/v1/runs/nope/stop", None, 404, "not_found"),
    ("GET", "/v1/runs/x/logs?stream=stdin", None, 422, "invalid_request"),
    ("PATCH", "/v1/runs/x", {"bogus": 1}, 422, "invalid_request"),
    ("POST", "/v1/runs", {}, 422, "invalid_request"),
    ("POST", "/v1/runs", "not json", 422, "invalid_request"),
    ("GET", "/v1/stream?kinds=bogus", None, 400, "bad_input"),
    ("GET", "/v1/processes?until=100", None, 400, "bad_input"),
    ("GET", "/v1/processes?since=100&until=50", None, 400, "bad_input"),
    ("GET", "/v1/processes?since=-1", None, 422, "invalid_request"),
    ("GET", "/v1/processes?since=1&gpu=GPU-nope", None, 404, "not_found"),
    ("GET", "/v1/processes?since=1&limit=0", None, 422, "invalid_request"),
    ("GET", "/v1/history?window=99999999999d", None, 400, "bad_input"),
    ("POST", "/v1/runs", b"\xff\xfe{}", 422, "invalid_request"),
    ("POST", "/v1/runs", b"\x80abc", 400, "bad_input"),  # not UTF-8 at all
    ("POST", "/v1/runs", "[1, 2, 3]", 422, "invalid_request"),
    ("POST", "/v1/runs", '{"spec": ', 422, "invalid_request"),
]


def test_errors_are_one_line_json_with_the_right_status(gw: DaemonHandle) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        for method, path, body, status, code in ERROR_CASES:
            if isinstance(body, str | bytes):
                response = http.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
            else:
                response = http.request(method, path, json=body)
            assert response.status_code == status, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] == code, (method, path, error)
            assert error["message"] and "\n" not in error["message"]
            if body == "[1, 2, 3]":
                assert error["message"].startswith("request: the body must be a JSON object"), error
            if body in ('{"spec": ', "not json"):
                assert error["message"].startswith("request: the body is not valid JSON ("), error


def test_spec_yaml_errors_name_file_and_line(gw: DaemonHandle) -> None:
    text = 'name: t\nkind: command\ncommand:\n  argv: ["true"]\nresources:\n  gpus: -1\n'
    with gw.client() as client, pytest.raises(UserError) as err:
        client.submit_yaml(text, gw.root, label="t.yaml")
    assert str(err.value).startswith("t.yaml:6: resources.gpus")


def test_stream_sends_samples_runs_and_events(gw: DaemonHandle) -> None:
    frames: list[StreamFrame] = []
    done, subscribed = threading.Event(), threading.Event()

    def reader() -> None:
        with gw.client() as client:
            for frame in client.stream():
                frames.append(frame)
                subscribed.set()  # the first sample frame: this client is on the stream
                if frame.event == "run" and frame.data.get("state") == "succeeded":
                    break
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert subscribed.wait(15)
    gw.submit(command_spec("streamed", "print('hi')"))
    assert done.wait(15), [f.event for f in frames]
    kinds = {f.event for f in frames}
    assert kinds == {"sample", "run", "event"}
    sample = next(f for f in frames if f.event == "sample")
    assert len(sample.data["gpus"]) == 2 and sample.data["host"] is not None
    assert all(f.dropped == 0 for f in frames)


# -- fuzzing from the OpenAPI description --------------------------------------------------------

RAW_SCHEMA = create_app(cast(Any, None)).openapi()
schema = schemathesis.openapi.from_dict(RAW_SCHEMA).exclude(path_regex="^/v1/(stream|shutdown)$")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonHandle, httpx.Client]]:
    import shutil
    import tempfile

    runtime = Path(tempfile.mkdtemp(prefix="gwf", dir="/tmp"))
    handle = DaemonHandle(tmp_path_factory.mktemp("fuzz"), runtime)
    handle.start()
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(handle.socket)), base_url="http://gpuwarden", timeout=60
    )
    try:
        yield handle, http
    finally:
        http.close()
        handle.stop()
        handle.kill_runs()
        shutil.rmtree(runtime, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_api_never_answers_5xx(case: Any, live: tuple[DaemonHandle, httpx.Client]) -> None:
    handle, http = live
    kwargs = case.as_transport_kwargs(base_url="http://gpuwarden")
    request: dict[str, Any] = {"params": kwargs.get("params"), "headers": kwargs.get("headers")}
    if "json" in kwargs:
        request["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        request["content"] = kwargs["data"]
    response = http.request(kwargs["method"], kwargs["url"], **request)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert "\n" not in error["message"]
    assert handle.proc is not None and handle.proc.poll() is None, "the daemon died"
