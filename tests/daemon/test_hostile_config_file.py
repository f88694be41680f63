"""A command run's own config file (`command.config_file`) is hostile input too.

Every file of the config corpus (tests/hostile_corpus.py: a link to /dev/zero, a FIFO, 50 MB,
JSON/TOML/YAML nested 100 000 deep, alias bombs, binary…) through every place that reads it:
`run` (a spec, and the flags' form), `tune`, `doctor` (plain and --json), `POST /v1/runs`, an
edit, and an attempt's copy when the file is swapped between attempts. Each ends in one line, in
bounded time and memory, with the API answering throughout and nothing executed or created.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon.conftest import DaemonHandle, command_spec
from tests.daemon.test_hostile_corpus import (
    MEMORY_BOUND_KB,
    SECONDS_BOUND,
    _daemon_peak_kb,
    _drive,
    _not_refused_properly,
    _tree,
)
from tests.hostile_corpus import MARKER_NAME, write_config_corpus

# Taken by the round-trip parser without being run: the user's program may read its own tags.
ACCEPTED = {"cfg-python-tag.yaml"}


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    root = tmp_path / "sandbox"
    files = write_config_corpus(root / "corpus", root)
    return root, files


def _spec_text(config: Path) -> str:
    return (
        "name: hostile-config\nkind: command\nresources: {gpus: 0}\n"
        f'command:\n  argv: [python3, -c, pass, --config, "{{config_file}}"]\n  config_file: {config}\n'
    )


def _spec(config: Path) -> dict[str, Any]:
    spec = command_spec("hostile-config", "pass", resources={"gpus": 0})
    spec["command"].update({"argv": [*spec["command"]["argv"], "{config_file}"], "config_file": str(config)})
    return spec


def test_every_config_file_through_every_command(
    gw: DaemonHandle, configs: tuple[Path, dict[str, Path]]
) -> None:
    root, files = configs
    specs = {}
    for name, path in files.items():
        specs[name] = root / f"spec-{name}.yaml"
        specs[name].write_text(_spec_text(path))
    before = _tree(root)
    commands = [["run"], ["run", "--json"], ["tune"], ["tune", "--json"], ["doctor"], ["doctor", "--json"]]
    cases: list[dict[str, Any]] = [
        {"argv": [*cmd[:1], str(specs[name]), *cmd[1:]], "name": name}
        for cmd in commands
        for name in files
        if name not in ACCEPTED
    ]
    flags = ["--memory-limit", "1GiB", "--", "python3", "-c", "pass", "--config", "{config_file}"]
    cases += [
        {"argv": ["run", "--config-file", str(path), *flags], "name": name}
        for name, path in files.items()
        if name not in ACCEPTED
    ]
    report = _drive(gw, cases)

    failures = []
    for case, result in zip(cases, report["results"][1:], strict=True):
        why = _not_refused_properly(result)
        if why is None and case["name"].removeprefix("cfg-") not in result["stderr"]:
            why = f"does not name the file: {result['stderr']}"
        if why is not None:
            failures.append(f"{' '.join(result['argv'][:2])}: {why}")
    assert not failures, "\n".join(failures)
    assert report["peak_kb"] - report["baseline_kb"] < MEMORY_BOUND_KB
    assert not (root / MARKER_NAME).exists()
    assert _tree(root) == before
    with gw.client() as client:
        assert client.runs() == []


def test_every_config_file_through_the_api(gw: DaemonHandle, configs: tuple[Path, dict[str, Path]]) -> None:
    root, files = configs
    baseline = _daemon_peak_kb(gw)
    transport = httpx.HTTPTransport(uds=str(gw.socket))
    with httpx.Client(transport=transport, base_url="http://gpuwarden", timeout=SECONDS_BOUND) as http:
        for name, path in files.items():
            started = time.monotonic()
            response = http.post("/v1/runs", json={"spec": _spec(path)})
            if name in ACCEPTED:
                assert response.status_code == 201, response.text[:300]
                continue
            assert response.status_code == 400, (name, response.status_code, response.text[:300])
            message = response.json()["error"]["message"]
            assert "\n" not in message and len(message) < 1000 and str(path) in message, (name, message)
            assert time.monotonic() - started < SECONDS_BOUND, name
    assert _daemon_peak_kb(gw) - baseline < MEMORY_BOUND_KB
    assert "Traceback" not in gw.log.read_text()
    assert not (root / MARKER_NAME).exists()


def test_submits_of_a_fifo_never_hold_the_api(
    gw: DaemonHandle, configs: tuple[Path, dict[str, Path]]
) -> None:
    """A FIFO used to block a request thread for good: 45 of them and /v1/health stopped answering."""
    _, files = configs
    answers: list[int] = []

    def submit() -> None:
        transport = httpx.HTTPTransport(uds=str(gw.socket))
        with httpx.Client(transport=transport, base_url="http://gpuwarden", timeout=SECONDS_BOUND) as http:
            answers.append(http.post("/v1/runs", json={"spec": _spec(files["cfg-fifo.toml"])}).status_code)

    threads = [threading.Thread(target=submit) for _ in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SECONDS_BOUND * 2)
    assert answers == [400] * 60
    with gw.client(timeout=2.0) as client:
        assert client.health().api_version


def test_an_edit_and_a_later_attempt_read_the_file_within_bounds(gw: DaemonHandle, tmp_path: Path) -> None:
    """The file is the user's and can change after the submit: an edit naming a hostile one is
    refused, and an attempt whose file became one fails with the reason instead of hanging."""
    config = tmp_path / "config.toml"
    config.write_text("[training]\nbatch_size = 4\n")
    spec = _spec(config)
    spec["command"]["argv"][2] = "import sys; sys.exit(3)"
    run = gw.submit(spec)
    assert gw.wait_state(run["id"])["state"] == "failed"

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    transport = httpx.HTTPTransport(uds=str(gw.socket))
    with httpx.Client(transport=transport, base_url="http://gpuwarden", timeout=SECONDS_BOUND) as http:
        answer = http.patch(f"/v1/runs/{run['id']}", json={"set": {"command.config_file": str(fifo)}})
    assert answer.status_code == 400, answer.text
    assert "not a regular file" in answer.json()["error"]["message"]

    config.unlink()
    config.symlink_to("/dev/zero")
    resumed = gw.cli("resume", run["id"])
    assert resumed.returncode == 0, resumed.stderr
    ended = gw.wait_state(run["id"], timeout=60)
    assert ended["state"] == "failed"
    assert "not a regular file" in ended["message"] and "\n" not in ended["message"], ended["message"]
    with gw.client(timeout=2.0) as client:
        assert client.health()
