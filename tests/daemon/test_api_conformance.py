"""Schemathesis over every operation of the API, with every check, against a live daemon.

The daemon is a real subprocess with two fake H100s, reached over its socket (only /v1/shutdown
goes to an app over a stand-in that records the request, so the daemon stays up); the cases come from
/v1/openapi.json with a fixed seed and a bounded number per operation, so the run is the same
each time and stays short. Any finding fails: an undocumented status, a body or content type the
description does not promise, valid data refused, invalid data accepted, a wrong `Allow`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from starlette.testclient import TestClient

from gpuwarden.daemon.http import create_app
from tests.daemon.conftest import DaemonHandle, command_spec

CONFIG = SchemathesisConfig.from_str(
    """
seed = 20251121

[generation]
max-examples = 12
deterministic = true

[checks.negative_data_rejection]
# An oversized body is refused with 413 before it is read.
expected-statuses = ["400", "404", "405", "409", "413", "422"]

# Requests the description cannot tell apart from good ones, refused with a documented status
# (one parameter cannot be tied to another in OpenAPI, nor a spec's content to its loader):
[[operations]]
# a window past ten years, or a GPU metric asked of the host (400)
include-path = "/v1/history"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404"]

[[operations]]
# a spec is checked by the spec loader, with file:line messages (400, 422)
include-path = "/v1/runs"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409", "422"]

[[operations]]
# another user's process, or one that is not on a GPU (400, 404)
include-path-regex = "^/v1/processes/"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "409"]
"""
)
schema = schemathesis.openapi.from_dict(create_app(cast(Any, None)).openapi(), config=CONFIG)
BASE = "http://gpuwarden"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonHandle, httpx.Client]]:
    runtime = Path(tempfile.mkdtemp(prefix="gwf", dir="/tmp"))  # socket paths must stay short
    handle = DaemonHandle(tmp_path_factory.mktemp("conformance"), runtime)
    handle.start()
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(handle.socket)), base_url=BASE, timeout=60)
    try:
        yield handle, http
    finally:
        http.close()
        handle.stop()
        handle.kill_runs()
        shutil.rmtree(runtime, ignore_errors=True)


class _ShutdownOnly:
    """What /v1/shutdown needs of a daemon: asking it to stop (recorded, so the live daemon the
    other operations use keeps running)."""

    def __init__(self) -> None:
        self.asked = 0

    def request_shutdown(self) -> None:
        self.asked += 1


SHUTDOWN = _ShutdownOnly()
SHUTDOWN_APP = TestClient(create_app(cast(Any, SHUTDOWN)), base_url=BASE)


def _send(http: httpx.Client, case: Any) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url=BASE)
    if case.path == "/v1/shutdown":
        http = cast(httpx.Client, SHUTDOWN_APP)  # a TestClient is an httpx.Client bound to the app
    request = http.build_request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params"),
        headers=kwargs.get("headers"),
        json=kwargs.get("json"),
        content=kwargs.get("data") if "json" not in kwargs else None,
        cookies=kwargs.get("cookies"),
    )
    if case.path != "/v1/stream":
        return http.send(request)
    # The stream never ends by itself: keep its head and first bytes, then hang up.
    response = http.send(request, stream=True)
    try:
        first = next(response.iter_raw(), b"") if response.status_code == 200 else response.read()
    finally:
        response.close()
    head = httpx.Response(response.status_code, headers=response.headers, content=first, request=request)
    head.elapsed = response.elapsed
    return head


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_conforms(case: Any, live: tuple[DaemonHandle, httpx.Client]) -> None:
    handle, http = live
    response = _send(http, case)
    case.validate_response(response, headers=dict(response.request.headers))
    if response.status_code >= 400:
        assert "\n" not in response.json()["error"]["message"]
    assert handle.proc is not None and handle.proc.poll() is None, "the daemon died"


def _checked(http: httpx.Client, case: Any) -> httpx.Response:
    """One request, answered by the live daemon and judged by every check against the description."""
    response = _send(http, case)
    case.validate_response(response, headers=dict(response.request.headers))
    return response


def test_what_the_fuzzer_found_is_answered_as_described(live: tuple[DaemonHandle, httpx.Client]) -> None:
    """Requests `--checks all` once found answered otherwise than described, each now either
    accepted, or refused with a status the description gives it."""
    handle, http = live
    ids = [
        handle.submit(command_spec(n, "pass", resources={"gpus": 0}))["id"]
        for n in ("o-1", "o-2", "twice", "twice")
    ]
    for run_id in ids:
        handle.wait_state(run_id)
    # A reference several runs answer to: valid, and refused because of what is there now.
    retunes = _checked(http, schema["/v1/runs/{ref}/retunes"]["GET"].Case(path_parameters={"ref": "o-"}))
    assert (retunes.status_code, retunes.json()["error"]["code"]) == (409, "ambiguous")
    deleted = _checked(http, schema["/v1/runs/{ref}"]["DELETE"].Case(path_parameters={"ref": "twice"}))
    assert (deleted.status_code, deleted.json()["error"]["code"]) == (409, "ambiguous")
    # `gpu` without `since` filters the latest scan; `until` alone reads stored reads up to it.
    gpu = handle.client().gpus().gpus[0].uuid
    scan = _checked(http, schema["/v1/processes"]["GET"].Case(query={"gpu": gpu}))
    assert scan.status_code == 200 and "processes" in scan.json() and "truncated" not in scan.json()
    before = _checked(http, schema["/v1/processes"]["GET"].Case(query={"gpu": gpu, "until": 5.0}))
    assert before.status_code == 200 and before.json()["processes"] == []
    empty = _checked(http, schema["/v1/processes"]["GET"].Case(query={"since": 9.0, "until": 5.0}))
    assert empty.status_code == 200 and empty.json()["processes"] == []
    # An empty metric name, and an empty spec text, are outside the description: refused as such.
    history = _checked(http, schema["/v1/history"]["GET"].Case(query={"metric": [""], "host": "true"}))
    assert history.status_code == 400
    submit = schema["/v1/runs"]["POST"].Case(
        body={"spec": None, "spec_yaml": ""}, media_type="application/json"
    )
    assert _checked(http, submit).status_code == 422
