"""A real daemon with `notify:` configured: runs that fail reach a real HTTP receiver (apprise's
json://) and a real command; a flood is rate-limited; a receiver that hangs or refuses delays
nothing and its failure is recorded as an event of the run."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon.conftest import DaemonHandle, command_spec, wait_for
from tests.daemon.test_logs_follow import retuned_spec
from tests.notify.conftest import Receiver, Silent

HOOK = """
import json, os, sys
got = {"stdin": json.load(sys.stdin), "env": {k: v for k, v in os.environ.items() if k.startswith("GPUWARDEN_")}}
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(got) + "\\n")
"""
FAILING = "import sys; print('loading the data'); print('ValueError: shapes (3,4) and (5,) do not align', file=sys.stderr); sys.exit(1)"


def start_with(daemon_factory: Any, notify: dict[str, Any]) -> DaemonHandle:
    gw: DaemonHandle = daemon_factory(start=False)
    config = gw.root / "config" / "gpuwarden" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({"notify": notify}))
    gw.start()
    return gw


def _events(gw: DaemonHandle, run_id: str, type_: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [
            e.model_dump(mode="json") for e in client.events(run_id, limit=10_000).events if e.type == type_
        ]


def _post(receiver: Receiver, title: str) -> dict[str, Any]:
    """The first message titled `title` the receiver got (waiting for it)."""
    found: list[dict[str, Any]] = wait_for(
        lambda: [p for p in receiver.posts if p["title"] == title], f"{title!r} at the receiver"
    )
    return found[0]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_failed_run_reaches_the_receiver_and_the_command(
    daemon_factory: Any, receiver: Receiver, tmp_path: Path
) -> None:
    hook, got = tmp_path / "hook.py", tmp_path / "hook.jsonl"
    hook.write_text(HOOK)
    gw = start_with(
        daemon_factory, {"urls": [receiver.url], "on_event": [sys.executable, str(hook), str(got)]}
    )
    run = gw.submit(command_spec("doomed", FAILING))
    assert gw.wait_state(run["id"])["state"] == "failed"

    post = _post(receiver, "doomed failed")
    host = socket.gethostname()
    assert post["message"].startswith(f"Run doomed ({run['id']}) on {host} failed: attempt 1: exit code 1")
    assert post["message"].endswith(
        "Last lines of attempt 1's stderr:\nValueError: shapes (3,4) and (5,) do not align"
    ), post["message"]

    told = wait_for(lambda: _lines(got), "the hook")
    (failed,) = [t for t in told if t["stdin"]["event"] == "failed"]
    assert failed["stdin"]["run_id"] == run["id"] and failed["stdin"]["host"] == host
    assert failed["stdin"]["title"] == "doomed failed" and "do not align" in failed["stdin"]["body"]
    env = failed["env"]
    assert env["GPUWARDEN_EVENT"] == "failed" and env["GPUWARDEN_RUN"] == run["id"]
    assert env["GPUWARDEN_RUN_NAME"] == "doomed" and env["GPUWARDEN_HOST"] == host


@pytest.mark.slow
def test_a_flood_of_restarts_is_rate_limited_and_the_end_says_how_many(
    daemon_factory: Any, receiver: Receiver
) -> None:
    gw = start_with(daemon_factory, {"urls": [receiver.url], "max_per_run": 2, "per_minutes": 60})
    restart = {"on": [{"exit_code": [1]}], "max": 6, "backoff": 0}
    run = gw.submit(command_spec("flood", FAILING, restart=restart))
    assert gw.wait_state(run["id"], timeout=180)["state"] == "failed"
    assert len(_events(gw, run["id"], "restart")) == 6

    last = _post(receiver, "flood failed")
    titles = [p["title"] for p in receiver.posts]
    assert titles == ["flood restarted", "flood restarted", "flood failed"], titles
    assert last["message"].endswith("(and 4 more held back by the rate limit: restarted ×4)"), last["message"]


@pytest.mark.slow
def test_a_hung_or_refusing_receiver_delays_no_run_and_is_recorded(
    daemon_factory: Any, silent: Silent, refused_url: str
) -> None:
    timeout_s = 5.0
    gw = start_with(
        daemon_factory, {"urls": [silent.url, refused_url], "send_timeout": timeout_s, "retries": 0}
    )
    run = gw.submit(command_spec("unheard", FAILING))
    done = gw.wait_state(run["id"])
    assert done["state"] == "failed"
    # The run's end was recorded as soon as its process exited: the daemon's own clock says so,
    # whatever the machine's load did to this test's polling.
    (state,) = [e for e in _events(gw, run["id"], "state") if e["state"] == "failed"]
    with gw.client() as client:
        exited = client.run(run["id"]).attempts[-1].ended_at
    assert exited is not None and state["ts"] - exited < timeout_s

    def failures() -> dict[str, dict[str, Any]]:
        found = {e["target"]: e for e in _events(gw, run["id"], "notify_failed")}
        return found if len(found) == 2 else {}

    recorded = wait_for(failures, "both failures recorded")
    hung, refused = (recorded[url.removesuffix("hook") + "…"] for url in (silent.url, refused_url))
    assert "Read timed out" in hung["reason"] and hung["ts"] - state["ts"] >= timeout_s * 0.9
    assert refused["reason"].endswith("[Errno 111] Connection refused")
    shown = gw.cli("events", run["id"])
    assert "notify_failed" in shown.stdout, shown.stdout


@pytest.mark.slow
def test_a_hung_receiver_never_delays_a_retune(
    daemon_factory: Any, silent: Silent, receiver: Receiver
) -> None:
    """A run that runs out of memory is retuned and succeeds while the silent receiver still
    holds the first message: the retune does not wait for its 20 s send."""
    timeout_s = 20.0
    gw = start_with(
        daemon_factory, {"urls": [silent.url, receiver.url], "send_timeout": timeout_s, "retries": 0}
    )
    gate = gw.root / "gate"
    gate.touch()  # attempt 1 runs out of memory at once
    submitted = gw.cli("run", str(retuned_spec(gw.root, gate)), "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["id"]
    assert gw.wait_state(run_id)["state"] == "succeeded"

    with gw.client() as client:
        oom_at = client.run(run_id).attempts[0].ended_at
    (retuned,) = _events(gw, run_id, "retuned")
    (done,) = [e for e in _events(gw, run_id, "state") if e["state"] == "succeeded"]
    assert oom_at is not None and done["ts"] - oom_at < timeout_s, (oom_at, retuned["ts"], done["ts"])
    post = _post(receiver, "retuned retuned")
    assert "ran out of memory in attempt 1 and was retuned: " in post["message"], post["message"]
    assert "→ micro-batch 32 → 16, accumulation 1 → 2, effective batch 32 kept" in post["message"]
    _post(receiver, "retuned succeeded")
