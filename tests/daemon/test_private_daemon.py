"""A real daemon started under umask 022 keeps everything owner-only: its folders, the database
and its WAL files, run folders, attempts, specs, logs, events, and what gpuwarden's runners write
(a training runner's checkpoints and report). A user's own program writes its files with the
user's umask, as it would run directly; inside a run folder (0700) they stay out of reach."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

WRITES_A_CHECKPOINT = """
import os, sys
ckpt = os.path.join(sys.argv[1], "checkpoints", "00000001")
os.makedirs(ckpt)
with open(os.path.join(ckpt, "model.pt"), "w") as fh:
    fh.write("weights")
print("saved")
"""


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {}
    for path in [root, *root.rglob("*")]:
        if path.is_socket():
            continue
        out[str(path.relative_to(root.parent))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.mark.slow
def test_everything_a_daemon_and_its_runs_write_is_owner_only(daemon_factory: Any, umask_022: None) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    spec = command_spec("ckpt", WRITES_A_CHECKPOINT, resources={"gpus": 0})
    spec["command"]["argv"].append("{run_dir}")
    command_run = gw.submit(spec)
    train = gw.write_spec(
        "tiny-train",
        """
        name: tiny-train
        kind: train
        resources: {gpus: 0}
        train: {task: image, max_steps: 2, batch_size: 2, checkpoint_interval: 1, image: {base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 8}}
        """,
    )
    train_run = gw.cli_json("run", str(train))
    assert gw.wait_state(command_run["id"])["state"] == "succeeded"
    assert gw.wait_state(train_run["id"], timeout=120)["state"] == "succeeded"

    modes = _modes(gw.state_dir) | _modes(gw.runtime_dir)
    names = "\n".join(modes)
    for expected in (
        "gpuwarden.db-wal",
        "spec.yaml",
        "resolved.yaml",
        "stdout.log",
        "events.jsonl",
        "model.pt",
    ):
        assert expected in names, expected
    assert any("/checkpoints/" in name and name.endswith("meta.json") for name in modes)  # the runner's own
    command_folder = f"runs/{command_run['id']}"
    assert modes[next(n for n in modes if n.endswith(command_folder))] == 0o700
    # The command's own files are the user's (umask 022), behind its 0700 run folder.
    loose = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert loose and all(f"{command_folder}/checkpoints" in name for name in loose), loose


def test_a_users_own_program_writes_its_files_with_the_users_umask(
    daemon_factory: Any, umask_022: None, tmp_path: Path
) -> None:
    """Run directly, the script's `out/` is 0755 and its file 0644: so under gpuwarden too."""
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    project = tmp_path / "project"
    project.mkdir()
    writes = "import os; os.makedirs('out'); open('out/result.txt', 'w').write('done')"
    spec = command_spec("writes-out", writes, resources={"gpus": 0}, command={"cwd": str(project)})
    run = gw.submit(spec)
    assert gw.wait_state(run["id"])["state"] == "succeeded"
    assert stat.S_IMODE((project / "out").stat().st_mode) == 0o755
    assert stat.S_IMODE((project / "out" / "result.txt").stat().st_mode) == 0o644


def test_a_relative_state_dir_in_the_config_starts_at_the_config_file(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    config = gw.root / "config" / "gpuwarden" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("paths:\n  state_dir: ../../my-state\n")
    gw.start()  # from gw.root, not from the config's folder
    health = gw.cli_json("status")["daemon"]
    expected = (gw.root / "my-state" / "gpuwarden.db").resolve()
    assert Path(health["db"]).resolve() == expected
    assert stat.S_IMODE(expected.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("how", ["up", "daemon"])
def test_missing_base_folders_are_made_0700_and_existing_ones_left(
    daemon_factory: Any, umask_022: None, how: str
) -> None:
    """The XDG Base Directory spec: a program that creates $XDG_STATE_HOME (or a runtime or
    config base folder) creates it 0700; so gpuwarden makes every folder it has to 0700."""
    gw: DaemonHandle = daemon_factory(start=False)
    kept, short = gw.root / "kept", gw.runtime_dir.parent  # short: the socket's path must fit
    kept.mkdir(mode=0o755)
    gw.env.update(
        XDG_STATE_HOME=str(kept / "made" / "state"),
        XDG_CONFIG_HOME=str(kept / "made" / "config"),
        GPUWARDEN_PATHS__RUNTIME_DIR=str(short / "made" / "gpuwarden"),
    )
    if how == "up":
        started = gw.cli("up")
        assert started.returncode == 0, started.stderr
    else:
        log = gw.log.open("ab")
        gw.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "daemon"], env=gw.env, stdout=log, stderr=log
        )
        log.close()
        wait_for(lambda: gw.cli("status").returncode == 0, "the daemon to answer")
    try:
        made = [kept / "made", kept / "made" / "state", kept / "made" / "state" / "gpuwarden"]
        made += [short / "made", short / "made" / "gpuwarden"]
        modes = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in [kept, *made]}
        assert modes == {str(kept): "0o755", **{str(p): "0o700" for p in made}}
        assert not (kept / "made" / "config").exists()  # nothing to write there: not made
    finally:
        assert gw.cli("down").returncode == 0
