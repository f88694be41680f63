"""`gpuwarden notify test` as a user types it, and what a machine without apprise is told."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.daemon.conftest import REPO, DaemonHandle
from tests.notify.conftest import Receiver

# Runs gpuwarden's CLI as if apprise were not installed.
WITHOUT_APPRISE = "import sys; sys.modules['apprise'] = None; from gpuwarden.cli.main import main; main()"


def _gpuwarden(
    tmp_path: Path, notify: dict[str, Any] | None, *args: str, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"notify": notify} if notify else {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env |= {"GPUWARDEN_CONFIG": str(config), "PYTHONPATH": str(REPO)}
    head = ["-c", code] if code else ["-m", "gpuwarden"]
    return subprocess.run(
        [sys.executable, *head, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_notify_test_reaches_every_target_and_says_which_failed(
    tmp_path: Path, receiver: Receiver, refused_url: str
) -> None:
    out = tmp_path / "hook.json"
    hook = [sys.executable, "-c", f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"]
    result = _gpuwarden(tmp_path, {"urls": [receiver.url, refused_url], "on_event": hook}, "notify", "test")
    assert result.returncode == 1, result.stderr
    port = refused_url.split(":")[2].split("/")[0]
    assert result.stdout.splitlines() == [
        f"ok      json://127.0.0.1:{receiver.server.server_port}/…",
        f"failed  json://127.0.0.1:{port}/…: A Connection error occurred sending JSON notification to "
        "127.0.0.1: [Errno 111] Connection refused",
        "ok      on_event: python" + sys.executable.rsplit("python", 1)[1],
    ], result.stdout
    (post,) = receiver.posts
    assert post["title"].endswith(": test notification")
    assert json.loads(out.read_text())["event"] == "test"


def test_notify_test_json_and_all_ok(tmp_path: Path, receiver: Receiver) -> None:
    result = _gpuwarden(tmp_path, {"urls": [receiver.url]}, "notify", "test", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["targets"]
    assert row == {"target": f"json://127.0.0.1:{receiver.server.server_port}/…", "ok": True, "error": None}


def test_notify_test_without_targets_says_where_to_add_them(tmp_path: Path) -> None:
    result = _gpuwarden(tmp_path, None, "notify", "test")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr == (
        f"gpuwarden: no notification targets: add notify.urls or notify.on_event to {tmp_path / 'config.yaml'} "
        "(see docs/fleet.md)\n"
    )


def test_without_apprise_notify_test_names_the_fix(tmp_path: Path) -> None:
    result = _gpuwarden(tmp_path, {"urls": ["ntfy://my-topic"]}, "notify", "test", code=WITHOUT_APPRISE)
    assert result.returncode != 0
    assert result.stderr == (
        "gpuwarden: notify.urls: sending to ntfy://my-topic needs apprise, which is not installed — "
        "pip install 'gpuwarden[notify]' (or remove notify.urls)\n"
    )


def test_without_apprise_the_daemon_names_the_fix_as_it_starts(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    config = gw.root / "config" / "gpuwarden" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("notify:\n  urls: [ntfy://my-topic]\n")
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_APPRISE, "daemon"],
        env=gw.env, capture_output=True, text=True, timeout=120, cwd=gw.root,
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "gpuwarden: notify.urls: sending to ntfy://my-topic needs apprise, which is not installed — "
        "pip install 'gpuwarden[notify]' (or remove notify.urls)"
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_a_daemon_without_notify_never_imports_apprise() -> None:
    code = (
        "import sys, json, gpuwarden.cli.main, gpuwarden.cli.daemon_cmds, gpuwarden.daemon.daemon;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('apprise', 'gpuwarden.daemon.notify')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout) == []
