"""ApiClient without a daemon: version check on connect, error mapping, SSE parsing."""

from __future__ import annotations

from pathlib import Path

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
