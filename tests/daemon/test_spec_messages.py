"""A mistake in a spec or the config file, as the CLI tells it: one line, at file:line, in the
words of a YAML file (a mapping, a path, a number), never in Python's."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests import preloaded
from tests.daemon.conftest import DaemonHandle

COMMAND = "name: a\nkind: command\ncommand: {argv: [echo]}\n"


def test_spec_values_of_the_wrong_kind_are_named_in_plain_words(gw: DaemonHandle) -> None:
    cases = {
        "name: a\nkind: command\ncommand: [echo, hi]\n": (
            "3: command: must be a mapping (key: value lines) (got a list of 2 items)"
        ),
        COMMAND + "restart: true\n": "4: restart: must be a mapping (key: value lines) (got true)",
        "name: a\nkind: train\ntrain: {task: image, batch_size: true}\n": (
            "3: train.batch_size: must be a number, not true"
        ),
        COMMAND + "resources: {gpus: false}\n": "4: resources.gpus: must be a number, not false",
        "name: a\nkind: train\ntrain: {task: image, grad_clip: .inf}\n": (
            "3: train.grad_clip: must be a finite number, not inf"
        ),
    }
    for n, (text, expected) in enumerate(cases.items()):
        spec = gw.write_spec(f"s{n}", text)
        result = gw.cli("run", str(spec))
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr == f"gpuwarden: {spec}:{expected}\n"
    with gw.client() as client:
        assert client.runs() == []  # a `true` read as 1 would have queued one


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("paths: {state_dir: 5}\n", "paths.state_dir: must be a path (text) (got 5)"),
        ("retention: 5\n", "retention: must be a mapping (key: value lines) (got 5)"),
        ("stop_grace_seconds: true\n", "stop_grace_seconds: must be a number, not true"),
        ("metrics: {port: true}\n", "metrics.port: must be a number, not true"),
        ("retention: {raw_hours: .nan}\n", "retention.raw_hours: must be a finite number, not nan"),
    ],
)
def test_config_values_of_the_wrong_kind_are_named_in_plain_words(
    daemon_factory: Any, config: str, expected: str
) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    path = gw.root / "config" / "gpuwarden" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(config)
    # The file's value, not the test daemon's own GPUWARDEN_STOP_GRACE_SECONDS, is what is read.
    env = {k: v for k, v in gw.env.items() if k != "GPUWARDEN_STOP_GRACE_SECONDS"}
    result = preloaded.run([sys.executable, "-m", "gpuwarden", "daemon"], env=env, timeout=30, cwd=gw.root)
    assert (result.returncode, result.stderr) == (2, f"gpuwarden: {path}:1: {expected}\n")


def test_checks_after_validation_are_placed_at_the_key_they_name(gw: DaemonHandle) -> None:
    cases = {
        "name: a\nkind: command\ncommand:\n  argv: ['{nosuch}']\n": (
            "4: command.argv[0]: unknown placeholder {nosuch} — knobs and built-ins are: attempt,"
        ),
        "name: a\nkind: command\ncommand:\n  argv: [echo]\n  env: {A: '{zz}'}\n": (
            "5: command.env.A: unknown placeholder {zz} — knobs and built-ins are: attempt,"
        ),
        "name: a\nkind: command\ncommand:\n  argv: [echo, '{bs}']\n  roles: {micro_batch: bs}\nknobs:\n  bs: x\n": (
            "7: knobs.bs (command.roles.micro_batch) is 'x': a micro_batch must be a whole number ≥ 1"
        ),
        COMMAND + "resources:\n  gpus: 5\n": "5: resources.gpus: asks for 5 GPUs but this machine has 2",
    }
    for n, (text, expected) in enumerate(cases.items()):
        spec = gw.write_spec(f"s{n}", text)
        result = gw.cli("run", str(spec))
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith(f"gpuwarden: {spec}:{expected}"), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
