"""The API as clients meet it: socket permissions, foreign users, error shapes, SSE, fuzzing."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

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
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            answers = op["responses"]
            ok = next(body for status, body in answers.items() if status.startswith("2"))
            if path == "/v1/stream":
                assert list(ok["content"]) == ["text/event-stream"]
            else:
                schema = ok["content"]["application/json"]["schema"]
                assert "$ref" in schema or "anyOf" in schema, (method, path, schema)
            errors = {status: body for status, body in answers.items() if status.startswith("4")}
            assert "413" in errors, (method, path)  # every request's body is capped
            for status, body in errors.items():
                assert body["content"] == {"application/json": {"schema": error_body}}, (method, path, status)
    submit = doc["components"]["schemas"]["SubmitRequest"]
    assert [alt["required"] for alt in submit["oneOf"]] == [["spec"], ["spec_yaml"]]


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
    # longer than any run's name (SQLite's LIKE refuses a pattern of ~50 000 characters)
    ("GET", "/v1/runs/" + "a" * 50_001, None, 404, "not_found"),
    ("GET", "/v1/nothing", None, 404, "not_found"),
    ("DELETE", "/v1/health", None, 405, "method_not_allowed"),
    ("GET", "/v1/history?points=0", None, 422, "invalid_request"),
    ("GET", "/v1/history?window=soon", None, 400, "bad_input"),
    ("GET", "/v1/history?metric=bogus", None, 400, "bad_input"),
    ("POST", "/v1/runs", {"spec": {"name": "x"}}, 422, "invalid_config"),
    ("POST", "/v1/runs", {"spec_yaml": "name: [", "label": "s.yaml"}, 400, "bad_input"),
    ("POST", "/v1/runs", {"spec_yaml": "name: x\nkind: command\n", "label": "s.yaml"}, 422, "invalid_config"),
    ("POST", "/v1/runs/nope/stop", None, 404, "not_found"),
    # relative to what? the daemon's own working folder is nobody's answer
    (
        "POST",
        "/v1/runs",
        {"spec": {"name": "rel", "kind": "command", "command": {"argv": ["pwd"], "cwd": "."}}},
        400,
        "bad_input",
    ),
    ("GET", "/v1/runs/x/logs?stream=stdin", None, 422, "invalid_request"),
    ("PATCH", "/v1/runs/x", {"bogus": 1}, 422, "invalid_request"),
    ("POST", "/v1/runs", {}, 422, "invalid_request"),
    ("POST", "/v1/runs", "not json", 422, "invalid_request"),
    ("GET", "/v1/stream?kinds=bogus", None, 400, "bad_input"),
    ("GET", "/v1/processes?gpu=GPU-nope", None, 404, "not_found"),
    ("GET", "/v1/processes?since=-1", None, 422, "invalid_request"),
    ("GET", "/v1/processes?since=1&gpu=GPU-nope", None, 404, "not_found"),
    ("GET", "/v1/processes?since=1&limit=0", None, 422, "invalid_request"),
    ("GET", "/v1/history?window=99999999999d", None, 400, "bad_input"),
    ("POST", "/v1/runs", b"\xff\xfe{}", 422, "invalid_request"),
    ("POST", "/v1/runs", b"\x80abc", 400, "bad_input"),  # not UTF-8 at all
    ("POST", "/v1/runs", "[1, 2, 3]", 422, "invalid_request"),
    ("POST", "/v1/runs", '{"spec": ', 422, "invalid_request"),
    ("PUT", "/v1/runs", None, 405, "method_not_allowed"),
    ("POST", "/v1/runs", '{"spec": {"x": ' + "7" * 5000 + "}}", 400, "bad_input"),
    ("POST", "/v1/runs", '{"spec": ' + "[" * 5000 + "]" * 5000 + "}", 400, "bad_input"),
    ("POST", "/v1/runs", {"spec_yaml": "a: " + "[" * 900 + "]" * 900}, 400, "bad_input"),
    ("GET", "/v1/runs/" + "y" * 10_000, None, 404, "not_found"),
    ("GET", "/v1/history?host=true&metric=" + "z" * 3000, None, 400, "bad_input"),
]
# The words for what is wrong with a body, where one status covers several causes.
ERROR_WORDS = {
    "7777777": "a number with more than 4300 digits",
    '"spec": [[[': "nests arrays or objects too deeply",
    "'a: [[[": "nested deeper than 64 levels",
    r"\x80abc": "not UTF-8",
    "'cwd': '.'": "spec: command.cwd is a relative path and the request names no base_dir",
}


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
            words = [w for key, w in ERROR_WORDS.items() if key in str(body)]
            assert all(w in error["message"] for w in words), (words, error)
            # Values a client sent are cut: an error never echoes a megabyte back.
            assert len(error["message"]) < 400, (method, path[:40], len(error["message"]))
        allow = http.options("/v1/runs")
        assert allow.status_code == 204 and allow.headers["allow"] == "GET, OPTIONS, POST"
        # A JSON body sent as another type: the fix is the header, not the JSON.
        plain = http.post(
            "/v1/runs", content=b'{"spec": {"name": "x"}}', headers={"content-type": "text/plain"}
        )
        assert plain.status_code == 415 and plain.json()["error"]["message"] == (
            "request: the body was sent as text/plain: send it as JSON with Content-Type: application/json"
        )
        head = http.head("/v1/health")  # the Allow header names only what answers
        assert head.status_code == 405 and "HEAD" not in head.headers["allow"]
        wrong = http.put("/v1/runs/x/stop")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "OPTIONS, POST"


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


# More free memory than either fake GPU has: the run waits in the queue, where it may be edited.
WAITS = {"gpus": 1, "min_free_memory": "200GiB"}


def _patch(gw: DaemonHandle, ref: str, body: dict[str, Any]) -> httpx.Response:
    """PATCH as curl sends it: the JSON a user typed, `null`s included."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        return http.patch(f"/v1/runs/{ref}", json=body)


def test_patch_knobs_changes_the_named_ones_and_keeps_the_others(gw: DaemonHandle) -> None:
    spec = command_spec("knobbed", "pass", knobs={"bs": 16, "lr": 0.1, "tag": "a"}, resources=WAITS)
    spec["command"]["argv"] += ["{bs}", "{lr}"]
    run = gw.submit(spec)
    answer = _patch(gw, run["id"], {"knobs": {"lr": 0.01, "tag": None}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["spec"]["knobs"] == {"bs": 16, "lr": 0.01}
    with gw.client() as client:
        (edited,) = [e for e in client.events(run["id"]).events if e.type == "edited"]
    assert edited.model_dump()["changes"] == {"knobs.lr": [0.1, 0.01], "knobs.tag": ["a", None]}


def test_patch_refuses_a_knob_the_run_does_not_have_naming_its_knobs(gw: DaemonHandle) -> None:
    spec = command_spec("knobbed", "pass", knobs={"bs": 16, "lr": 0.1}, resources=WAITS)
    command_run = gw.submit(spec)
    train_run = gw.submit(
        {"name": "t5", "kind": "train", "resources": WAITS, "train": {"task": "image", "max_steps": 1}}
    )
    refusals: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        (command_run, {"knobs": {"nosuch": 1}}, "'nosuch' is not a knob of this run (its knobs: bs, lr)"),
        (command_run, {"knobs": {"lrr": None}}, "'lrr' is not a knob of this run (its knobs: bs, lr)"),
        (command_run, {"set": {"knobs.nosuch": 1}}, "'nosuch' is not a knob of this run (its knobs: bs, lr)"),
        (
            train_run,
            {"knobs": {"nosuch": 1}},
            "'nosuch' is not a knob of this run (it has none — a train run's settings are keys such as"
            " train.batch_size: set them by that name)",
        ),
    ]
    for run, body, message in refusals:
        answer = _patch(gw, run["id"], body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"] == {"code": "bad_input", "message": message}
    with gw.client() as client:  # a refused edit changes nothing
        assert client.run(command_run["id"]).spec["knobs"] == {"bs": 16, "lr": 0.1}
        assert client.run(train_run["id"]).spec["knobs"] == {}
