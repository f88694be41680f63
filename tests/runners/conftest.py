"""Fixtures for the runner tests: tiny models and data built once per session, and a helper that
runs `python -m gpuwarden.runners` as a real subprocess and parses what it wrote."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.core.events import decode
from gpuwarden.runners.testing_models import build_tiny_causal_lm, write_image_folder, write_text_dataset

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    """What one runner process left behind."""

    rc: int
    stdout: str
    stderr: str
    run_dir: Path
    events: list[dict[str, Any]]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_type(kind)
        assert len(found) == 1, f"expected one {kind} event, got {len(found)}: {self.events}\n{self.stderr}"
        return found[0]


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every line of an events file, decoded; a line that does not decode fails the test."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        event = decode(line)
        assert event is not None, f"undecodable event line: {line!r}"
        events.append(event)
    return events


def write_spec(path: Path, train: dict[str, Any], *, name: str = "test") -> Path:
    """A train RunSpec on the CPU with `train` as its section."""
    spec = {"version": 1, "name": name, "kind": "train", "resources": {"gpus": 0}, "train": train}
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def runner_command(spec: Path, run_dir: Path, attempt: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec), "--run-dir", str(run_dir)]
    if attempt is not None:
        cmd += ["--attempt", str(attempt)]
    return cmd


# One compute thread per runner: the suite runs a worker per core, and on a busy core torch's
# second OpenMP thread spins waiting for its partner (a tiny model's run costs half as much CPU
# again for nothing). Runs compared bit for bit all get the same setting.
PINNED_THREADS = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def runner_env() -> dict[str, str]:
    env = {**os.environ, **PINNED_THREADS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def address_space_limit(limit: int) -> Callable[[], None]:
    """A preexec_fn capping the child's address space (a real CPU out-of-memory, not a fake)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def run_attempt(
    train: dict[str, Any],
    run_dir: Path,
    *,
    attempt: int | None = None,
    limit: int | None = None,
    timeout: float = 240,
) -> RunResult:
    """Run one attempt of a train run in `run_dir` to completion and collect its events."""
    run_dir.mkdir(parents=True, exist_ok=True)
    n = attempt or len(list((run_dir / "attempts").glob("*"))) + 1
    spec = write_spec(run_dir.parent / f"{run_dir.name}-spec-{n}.yaml", train)
    proc = subprocess.run(
        runner_command(spec, run_dir, n),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=runner_env(),
        preexec_fn=address_space_limit(limit) if limit else None,
    )
    events_path = run_dir / "attempts" / str(n) / "events.jsonl"
    events = read_events(events_path) if events_path.exists() else []
    return RunResult(proc.returncode, proc.stdout, proc.stderr, run_dir, events)


RunRunner = Callable[..., RunResult]


@pytest.fixture
def run_runner(tmp_path: Path) -> RunRunner:
    """`run_attempt` with `run_dir` defaulting to a fresh directory of the test."""

    def run(train: dict[str, Any], *, run_dir: Path | None = None, **kwargs: Any) -> RunResult:
        return run_attempt(train, run_dir or tmp_path / "run", **kwargs)

    return run


def wait_for_event(path: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    """Poll an events file until an event satisfies `predicate`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                event = decode(line)
                if event is not None and predicate(event):
                    return event
        time.sleep(0.05)
    raise AssertionError(f"no matching event in {path} after {timeout} s")


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny causal LM and texts shared by the session's tests."""
    root = tmp_path_factory.mktemp("runner-assets")
    return {
        "lm": build_tiny_causal_lm(root / "tiny-lm", hidden=64, layers=2, vocab=512, seed=0),
        "texts": write_text_dataset(root / "texts.jsonl", 96, seed=1),
    }


@pytest.fixture(scope="session")
def image_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Image folders shared by the session's tests (apart from the LM, which image tests never use)."""
    root = tmp_path_factory.mktemp("runner-images")
    return {
        "images": write_image_folder(root / "images", 12, (80, 64), seed=2),
        "keypoint_images": write_image_folder(root / "kp-images", 12, 48, seed=3, keypoints=3),
    }


def load_final_weights(run_dir: Path) -> dict[str, Any]:
    """The model state dict of the run's newest checkpoint."""
    import torch

    from gpuwarden.runners.checkpoint import find_latest_checkpoint

    ckpt = find_latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None, f"no checkpoint in {run_dir}"
    state: dict[str, Any] = torch.load(ckpt / "model.pt", weights_only=True)
    return state


def report_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return data
