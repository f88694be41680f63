"""Targets and sender threads against real receivers: apprise's json:// to a local HTTP server
(one that answers, one that never does, a closed port) and a real command."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.core.config.settings import NotifySettings
from gpuwarden.core.errors import UserError
from gpuwarden.core.notify.notice import Notice
from gpuwarden.core.notify.rules import RunFacts
from gpuwarden.daemon.notify.delivery import Delivery
from gpuwarden.daemon.notify.notifications import Notifications
from gpuwarden.daemon.notify.targets import AppriseTarget, CommandTarget, SendFailed, url_label
from tests.daemon.conftest import wait_for
from tests.notify.conftest import Receiver, Silent

NOTICE = Notice("failed", "bert failed", "Run bert (r1) on h failed", "h", 1.0, "r1", "bert", 2)


def test_apprise_json_reaches_a_local_receiver(receiver: Receiver) -> None:
    AppriseTarget(receiver.url, timeout=5).send(NOTICE)
    (post,) = receiver.posts
    assert post["title"] == "bert failed" and post["message"] == "Run bert (r1) on h failed"


def test_a_receiver_that_never_answers_fails_within_the_timeout(silent: Silent) -> None:
    target = AppriseTarget(silent.url, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(SendFailed, match="Read timed out"):
        target.send(NOTICE)
    assert time.monotonic() - start < 30  # bounded by the timeout, not by the receiver


def test_a_closed_port_fails_with_its_reason(refused_url: str) -> None:
    with pytest.raises(SendFailed) as e:
        AppriseTarget(refused_url, timeout=2).send(NOTICE)
    assert str(e.value) == (
        "A Connection error occurred sending JSON notification to 127.0.0.1: [Errno 111] Connection refused"
    )


def test_a_url_apprise_cannot_use_is_one_line() -> None:
    with pytest.raises(
        UserError, match=r"^notify.urls: nosuch://host/…: apprise does not understand this URL — check"
    ):
        AppriseTarget("nosuch://host/secret-token", timeout=1)


def test_a_label_never_shows_a_token() -> None:
    assert url_label("ntfy://user:pass@ntfy.example.com/topic") == "ntfy://ntfy.example.com/…"
    assert url_label("json://127.0.0.1:8080/hook") == "json://127.0.0.1:8080/…"
    assert url_label("slack://T1/B2/C3") == "slack://t1/…"


def test_the_command_gets_the_message_on_stdin_and_as_variables(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    code = (
        "import json, os, sys; json.dump({'stdin': json.load(sys.stdin), 'env': {k: v for k, v in "
        "os.environ.items() if k.startswith('GPUWARDEN_')}}, open(sys.argv[1], 'w'))"
    )
    CommandTarget([sys.executable, "-c", code, str(out)], timeout=30).send(NOTICE)
    got = json.loads(out.read_text())
    assert (
        got["stdin"]["event"] == "failed" and got["stdin"]["run_id"] == "r1" and got["stdin"]["attempt"] == 2
    )
    assert got["env"]["GPUWARDEN_EVENT"] == "failed" and got["env"]["GPUWARDEN_RUN_NAME"] == "bert"
    assert got["env"]["GPUWARDEN_HOST"] == "h" and got["env"]["GPUWARDEN_TITLE"] == "bert failed"


def test_a_command_that_outlives_its_bound_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    target = CommandTarget([sys.executable, "-c", code, str(pid_file)], timeout=1)
    with pytest.raises(SendFailed, match=r"still running after 1 s \(notify.on_event_timeout\): killed"):
        target.send(NOTICE)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_command_that_fails_says_how() -> None:
    code = "import sys; print('no token set', file=sys.stderr); sys.exit(3)"
    with pytest.raises(SendFailed, match=r"^exit status 3: no token set$"):
        CommandTarget([sys.executable, "-c", code], timeout=30).send(NOTICE)
    with pytest.raises(SendFailed, match=r"^cannot start /no/such/tell: No such file or directory$"):
        CommandTarget(["/no/such/tell"], timeout=30).send(NOTICE)


class Flaky:
    """Fails `failures` times, then takes messages."""

    label = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries = 0

    def send(self, notice: Notice) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise SendFailed(f"try {self.tries} refused")


def test_a_send_is_retried_then_reported_once() -> None:
    failures: list[tuple[str, str, int]] = []
    flaky = Flaky(failures=2)
    delivery = Delivery(
        flaky, retries=2, on_failure=lambda n, t, r, k: failures.append((t, r, k)), backoff_s=0
    )
    assert delivery.deliver(NOTICE) and flaky.tries == 3 and failures == []
    hopeless = Flaky(failures=100)
    delivery = Delivery(
        hopeless, retries=2, on_failure=lambda n, t, r, k: failures.append((t, r, k)), backoff_s=0
    )
    assert not delivery.deliver(NOTICE)
    assert hopeless.tries == 3 and failures == [("flaky", "try 3 refused", 3)]


class Stuck:
    """A receiver that never returns until released."""

    label = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def send(self, notice: Notice) -> None:
        self.entered.set()
        self.release.wait(60)


def test_a_hung_target_never_blocks_whoever_publishes() -> None:
    """The supervisor's and sampler's side costs a queue put, even with every queue full."""
    settings = NotifySettings(urls=["json://unused"], max_per_run=10_000)
    failures: list[str] = []
    notes = Notifications(
        settings, lambda run_id: RunFacts(run_id, "bert"), lambda n, t, r, k: failures.append(r), "h"
    )
    stuck = Stuck()
    notes.start([stuck])
    try:
        event = {"run_id": "r1", "type": "restart", "source": "daemon", "attempt": 1, "ts": 1.0}
        start = time.monotonic()
        for _ in range(5000):
            notes.offer_event(event)
        elapsed = time.monotonic() - start
        wait_for(stuck.entered.is_set, "the stuck target taking the first message")
        assert elapsed < 5.0, elapsed  # 5000 puts; a blocked put would wait for ever
        wait_for(lambda: "its queue is full (100)" in failures, "the full queue counted as a failure")
    finally:
        stuck.release.set()
        notes.stop()


def test_two_targets_failing_at_once_each_keep_their_own_reason(silent: Silent, refused_url: str) -> None:
    """apprise logs every send to one logger: a reason is read from this target's lines only."""
    reasons: dict[str, str] = {}

    def send(name: str, target: AppriseTarget) -> None:
        try:
            target.send(NOTICE)
        except SendFailed as exc:
            reasons[name] = str(exc)

    threads = [
        threading.Thread(target=send, args=("hung", AppriseTarget(silent.url, timeout=2))),
        threading.Thread(target=send, args=("refused", AppriseTarget(refused_url, timeout=2))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert "Read timed out" in reasons["hung"], reasons
    assert reasons["refused"].endswith("[Errno 111] Connection refused"), reasons


def test_what_was_heard_before_a_stop_is_still_sent(receiver: Receiver) -> None:
    """A run that failed just before `gpuwarden down`: the daemon's stop sends its message first."""
    settings = NotifySettings(urls=[receiver.url])
    notes = Notifications(settings, lambda run_id: RunFacts(run_id, "bert"), lambda *failed: None, "h")
    notes.start([AppriseTarget(receiver.url, timeout=10)])
    notes.offer_event({"run_id": "r1", "type": "state", "state": "failed", "source": "daemon", "attempt": 1})
    notes.stop(timeout=30)
    assert [p["title"] for p in receiver.posts] == ["bert failed"]


class Recorder:
    label = "recorder"

    def __init__(self) -> None:
        self.got: list[Notice] = []

    def send(self, notice: Notice) -> None:
        self.got.append(notice)


def test_what_the_limit_held_back_is_summed_up_when_the_window_reopens() -> None:
    now = [1000.0]
    settings = NotifySettings(urls=["json://unused"], max_per_run=1, per_minutes=1)
    notes = Notifications(
        settings, lambda run_id: RunFacts(run_id, "bert"), lambda *failed: None, "h", clock=lambda: now[0]
    )
    recorder = Recorder()
    notes.start([recorder])
    try:
        for attempt in (1, 2, 3):
            notes.offer_event({"run_id": "r1", "type": "restart", "source": "daemon", "attempt": attempt})
        wait_for(lambda: recorder.got and notes.limit.held == 2, "the first restart, the others held")
        now[0] += 61  # the window has room again
        wait_for(lambda: len(recorder.got) == 2, "the summary")
    finally:
        notes.stop()
    first, summary = recorder.got
    assert first.title == "bert restarted"
    assert (summary.event, summary.title, summary.run_id) == ("held", "bert: 2 more notifications", "r1")
    assert (
        summary.body
        == "2 more notifications about run bert (r1) on h were held back by the rate limit: restarted ×2."
    )
