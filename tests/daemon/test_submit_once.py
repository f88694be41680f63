"""A submit happens once or not at all.

A client that gave up waiting (the daemon was stopped or swamped) must not find the run started
later, and the same submit sent again with its key (after a timeout or a dropped connection)
must answer the run the first one queued, never queue a second.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwarden.client import ApiClient
from gpuwarden.core.errors import UserError
from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

SPEC = command_spec("once", "pass", resources={"gpus": 0})


def _http(gw: DaemonHandle) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gpuwarden", timeout=30
    )


def _runs_folders(gw: DaemonHandle) -> list[Path]:
    runs = gw.state_dir / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def test_a_submit_sent_again_with_its_key_answers_the_first_run(gw: DaemonHandle) -> None:
    key = {"Idempotency-Key": "retry-0001"}
    with _http(gw) as http:
        first = http.post("/v1/runs", json={"spec": SPEC}, headers=key)
        again = http.post("/v1/runs", json={"spec": SPEC}, headers=key)
        assert (first.status_code, again.status_code) == (201, 200), again.text
        assert again.json()["id"] == first.json()["id"]
        other = http.post("/v1/runs", json={"spec": {**SPEC, "name": "other"}}, headers=key)
        assert other.status_code == 422, other.text
        error = other.json()["error"]
        assert error["code"] == "key_reused" and "\n" not in error["message"]
        assert first.json()["id"] in error["message"]
        fresh = http.post("/v1/runs", json={"spec": SPEC}, headers={"Idempotency-Key": "retry-0002"})
        assert fresh.status_code == 201 and fresh.json()["id"] != first.json()["id"]
    with gw.client() as client:
        assert len(client.runs()) == 2


def test_twins_sent_at_once_queue_one_run(gw: DaemonHandle) -> None:
    answers: list[tuple[int, str]] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        with _http(gw) as http:
            barrier.wait()
            response = http.post("/v1/runs", json={"spec": SPEC}, headers={"Idempotency-Key": "twins-0001"})
            answers.append((response.status_code, response.json().get("id", response.text)))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 8 and {status for status, _ in answers} <= {200, 201}, answers
    assert len({run_id for _, run_id in answers}) == 1, answers
    with gw.client() as client:
        assert len(client.runs()) == 1
    assert len(_runs_folders(gw)) == 1


def test_a_submit_read_after_its_client_stopped_waiting_is_never_queued(gw: DaemonHandle) -> None:
    """The trial: the daemon did not answer in time, the client said so, and the run appeared
    later anyway. Here the daemon is stopped (SIGSTOP) while the submit waits in its socket, and
    reads it only after the deadline the client sent."""
    assert gw.proc is not None
    deadline = time.time() + 1.0
    headers = {"Idempotency-Key": "late-0001", "X-Gpuwarden-Deadline": f"{deadline:.3f}"}
    answers: list[httpx.Response] = []
    os.kill(gw.proc.pid, signal.SIGSTOP)
    try:
        with _http(gw) as http:
            sender = threading.Thread(
                target=lambda: answers.append(http.post("/v1/runs", json={"spec": SPEC}, headers=headers))
            )
            sender.start()
            wait_for(lambda: time.time() > deadline + 0.5, "the client's deadline to pass")
            os.kill(gw.proc.pid, signal.SIGCONT)
            sender.join(60)
    finally:
        os.kill(gw.proc.pid, signal.SIGCONT)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "deadline"
    assert "not queued: its submit came after its client stopped waiting" in gw.log.read_text()
    with gw.client() as client:
        assert client.runs() == []
        assert _runs_folders(gw) == []
        assert client.submit(SPEC).name == "once"  # sent again: queued, once
        assert len(client.runs()) == 1


def test_the_client_asks_for_an_answer_before_it_gives_up(gw: DaemonHandle) -> None:
    """What `gpuwarden run` and the dashboard send: a new key per submit, and a deadline that
    leaves the daemon's answer (or its not queueing) time to arrive before the client's wait ends."""
    sent: list[httpx.Request] = []
    with ApiClient(gw.socket, submit_timeout=20.0) as client:
        client._client.event_hooks["request"].append(sent.append)
        before = time.time()
        first = client.submit(SPEC)
        second = client.submit(SPEC)
    assert first.id != second.id
    keys = [request.headers["Idempotency-Key"] for request in sent if request.method == "POST"]
    deadlines = [
        float(request.headers["X-Gpuwarden-Deadline"]) for request in sent if request.method == "POST"
    ]
    assert len(set(keys)) == 2
    assert all(before + 10 < d < before + 20 for d in deadlines), (before, deadlines)


def test_a_client_that_gave_up_says_nothing_was_queued(gw: DaemonHandle) -> None:
    assert gw.proc is not None
    with ApiClient(gw.socket, submit_timeout=6.0) as client:
        client.health()  # the version check, while the daemon answers
        os.kill(gw.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(UserError) as refused:
                client.submit(SPEC)
        finally:
            os.kill(gw.proc.pid, signal.SIGCONT)
    assert refused.value.code == "timeout"
    assert "nothing was queued — submit again" in refused.value.message
    assert "\n" not in refused.value.message


def test_a_deadline_already_past_queues_nothing(gw: DaemonHandle) -> None:
    past = {"X-Gpuwarden-Deadline": f"{time.time() - 1:.3f}"}
    with _http(gw) as http:
        answer = http.post("/v1/runs", json={"spec": SPEC}, headers=past)
    assert answer.status_code == 503, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "deadline" and "nothing was queued" in error["message"]
    with gw.client() as client:
        assert client.runs() == []
    assert _runs_folders(gw) == []
