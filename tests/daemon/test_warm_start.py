"""Standbys for warm restarts, on real processes: a standby imports the script's libraries (not
the user's own modules) before it is handed an attempt, runs the script as `python script.py`
would once it is, and is killed rather than handed an attempt its imports could differ for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gpuwarden.core.exit_record import read_status
from gpuwarden.daemon.process import Child
from gpuwarden.daemon.warm_start import LocalWarmStarts, WarmLaunch, per_attempt_names

SCRIPT = """\
import json, os, sys
import fakelib
import mine

print(json.dumps({
    "argv": sys.argv,
    "file": __file__,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "lib_saw": fakelib.SAW,
    "mine_saw": mine.SAW,
    "knob": os.environ.get("BATCH"),
}))
if "--fail" in sys.argv:
    def deep():
        raise ValueError("the script's own failure")
    deep()
"""
RECORDS_ATTEMPT = "import os\nSAW = os.environ.get('GPUWARDEN_ATTEMPT')\n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A script with a module of its own beside it and a library on PYTHONPATH; each records the
    attempt number it saw in the environment as it was imported."""
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "mine.py").write_text(RECORDS_ATTEMPT)
    lib = tmp_path / "site" / "fakelib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(
        RECORDS_ATTEMPT + "import sys\nprint('fakelib: a warning', file=sys.stderr)\n"
    )
    return tmp_path


def _launch(folder: Path, attempt: int, *args: str, **extra: str) -> WarmLaunch:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(folder / "site"),
        "GPUWARDEN_ATTEMPT": str(attempt),
        **extra,
    }
    return WarmLaunch([sys.executable, "train.py", *args], env, folder, None, None)


def _wait(child: Child, timeout: float = 60) -> int:
    assert child.popen is not None
    return child.popen.wait(timeout=timeout)


def _gone(pid: int) -> bool:
    """Whether `pid` is no more: a standby's process is its recorder, this test's child, which
    discard and take wait for (and the tests wait for where they close)."""
    return not psutil.pid_exists(pid)


def _standby_pid(warm: LocalWarmStarts, run_id: str) -> int:
    standby = warm.standby(run_id)
    assert standby is not None
    return standby.child.pid


def test_a_standby_runs_the_attempt_with_its_libraries_imported_beforehand(folder: Path) -> None:
    warm = LocalWarmStarts()
    attempt_dir = folder / "attempts" / "2"
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", attempt_dir / "exit.json")
    attempt_dir.mkdir(parents=True)
    outputs = (attempt_dir / "stdout.log", attempt_dir / "stderr.log")
    launch = _launch(folder, 2, "--steps", "4", BATCH="8")
    child = warm.take("r1", 2, launch, outputs, per_attempt_names(["BATCH"]))
    assert child is not None
    assert _wait(child) == 0
    seen = json.loads(outputs[0].read_text())
    # The library was imported by the standby (it saw the standby's attempt), the user's module
    # only when the script ran (it saw the attempt's): each as `python train.py` would.
    assert seen["lib_saw"] == "1"
    assert seen["mine_saw"] == "2"
    assert seen["argv"] == ["train.py", "--steps", "4"]
    assert seen["file"] == str(folder / "train.py")
    assert seen["path0"] == str(folder)
    assert seen["cwd"] == str(folder)
    assert seen["knob"] == "8"
    assert outputs[1].read_text() == "fakelib: a warning\n"  # printed as it was imported, early
    assert read_status(str(attempt_dir / "exit.json")) == (0, None)
    assert warm.standby("r1") is None
    assert not (folder / "warm" / "2").exists()  # what it wrote as a standby moved to the attempt


def test_the_scripts_failure_prints_its_own_traceback_and_exit_status(folder: Path) -> None:
    warm = LocalWarmStarts()
    attempt_dir = folder / "attempts" / "2"
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", attempt_dir / "exit.json")
    attempt_dir.mkdir(parents=True)
    outputs = (attempt_dir / "stdout.log", attempt_dir / "stderr.log")
    launch = _launch(folder, 2, "--fail")
    child = warm.take("r1", 2, launch, outputs, per_attempt_names([]))
    assert child is not None
    assert _wait(child) == 1
    # The traceback `python train.py --fail` prints, with none of the standby's own frames.
    direct = subprocess.run(
        launch.argv, cwd=folder, env=launch.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert direct.returncode == 1
    assert outputs[1].read_text() == direct.stderr
    assert 'in deep\n    raise ValueError("the script\'s own failure")' in direct.stderr


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"extra": {"HF_HOME": "/elsewhere"}}, "a variable a library may read as it is imported"),
        ({"args": ("-m", "train")}, "another program"),
        ({"attempt": 3}, "a standby for another attempt"),
    ],
)
def test_an_attempt_its_imports_could_differ_for_starts_cold(
    folder: Path, change: dict[str, object], why: str
) -> None:
    warm = LocalWarmStarts()
    attempt_dir = folder / "attempts" / "2"
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", attempt_dir / "exit.json")
    pid = _standby_pid(warm, "r1")
    attempt_dir.mkdir(parents=True)
    extra = change.get("extra", {})
    assert isinstance(extra, dict)
    launch = _launch(folder, 2, **extra)
    if "args" in change:
        launch = WarmLaunch([sys.executable, "-m", "train"], launch.env, folder, None, None)
    number = int(str(change.get("attempt", 2)))
    outputs = (attempt_dir / "stdout.log", attempt_dir / "stderr.log")
    assert warm.take("r1", number, launch, outputs, per_attempt_names([])) is None, why
    # Killed and waited for, its recorder too: nothing of it can land in the attempt's folder.
    assert _gone(pid)
    assert not (attempt_dir / "exit.json").exists()
    assert not (folder / "warm" / "2").exists()
    assert warm.standby("r1") is None


def test_a_discarded_standby_is_gone_and_a_closed_one_ends_by_itself(folder: Path) -> None:
    warm = LocalWarmStarts()
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", folder / "attempts" / "2" / "exit.json")
    warm.prepare("r2", 2, _launch(folder, 1), folder / "warm" / "b", folder / "attempts" / "b" / "exit.json")
    first, second = _standby_pid(warm, "r1"), _standby_pid(warm, "r2")
    warm.discard("r1")
    assert _gone(first)
    # A daemon that stops lets its standbys go: each reads the end of its input and exits.
    standby = warm.standby("r2")
    assert standby is not None
    child = standby.child
    warm.close()
    assert _wait(child) == 0
    assert _gone(second)


def test_a_standby_whose_imports_started_cuda_leaves_rather_than_hold_a_gpu(folder: Path) -> None:
    # A stand-in for a library that makes torch start CUDA as it is imported (no GPU here).
    fake_torch = folder / "site" / "torch"
    fake_torch.mkdir()
    (fake_torch / "__init__.py").write_text("class cuda:\n    is_initialized = staticmethod(lambda: True)\n")
    (folder / "train.py").write_text("import torch\nprint('ran')\n")
    warm = LocalWarmStarts()
    attempt_dir = folder / "attempts" / "2"
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", attempt_dir / "exit.json")
    standby = warm.standby("r1")
    assert standby is not None
    assert _wait(standby.child) == 127
    assert (
        "the standby left: importing the script's libraries started CUDA"
        in (folder / "warm" / "2" / "stderr.log").read_text()
    )
    attempt_dir.mkdir(parents=True)
    outputs = (attempt_dir / "stdout.log", attempt_dir / "stderr.log")
    assert warm.take("r1", 2, _launch(folder, 2), outputs, per_attempt_names([])) is None  # starts cold


def test_no_standby_on_a_host_short_of_memory(folder: Path) -> None:
    warm = LocalWarmStarts(available_memory=lambda: 1 << 30)
    warm.prepare("r1", 2, _launch(folder, 1), folder / "warm" / "2", folder / "attempts" / "2" / "exit.json")
    assert warm.standby("r1") is None
    assert not (folder / "warm" / "2").exists()
