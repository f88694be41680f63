"""Starting gangs of the built-in training runner the way the daemon will: the torchrun command
from `gpuwarden.core.gang.launch`, spawned by `gpuwarden.daemon.process.spawn` (own session,
address-space limit through the exec wrapper, output in the attempt's log files)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.gang.files import rank_event_files
from gpuwarden.core.gang.launch import gang_launch, runner_program
from gpuwarden.daemon.process import Child, ExitStatus, spawn
from tests.runners.conftest import REPO, read_events

# Fewer threads and malloc arenas: the address space a rank reserves must not grow with the cores.
PINNED_ENV = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Gang:
    """One started torchrun attempt."""

    child: Child
    attempt_dir: Path
    started_at: float

    def wait(self, timeout: float) -> ExitStatus:
        """torchrun's exit status, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.child.poll()
            if status is not None:
                return status
            time.sleep(0.05)
        self.child.signal_tree(9)
        raise AssertionError(f"the gang in {self.attempt_dir} did not end within {timeout} s")

    def events(self) -> dict[int, list[dict[str, Any]]]:
        """Every rank's events so far."""
        files = rank_event_files(self.attempt_dir / "events.jsonl")
        return {rank: read_events(path) for rank, path in files.items()}

    def stderr(self) -> str:
        path = self.attempt_dir / "stderr.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def start_gang(
    section: dict[str, Any],
    run_dir: Path,
    attempt: int,
    *,
    limit: int | None = None,
    env: dict[str, str] | None = None,
) -> Gang:
    """Start attempt `attempt` of a CPU training gang whose `train:` section is `section`."""
    doc: dict[str, Any] = {
        "version": 1,
        "name": "gang",
        "kind": "train",
        "env": PINNED_ENV,
        "resources": {"gpus": 0, **({"memory_limit": limit} if limit else {})},
        "train": section,
    }
    spec = spec_from_mapping(doc)
    attempt_dir = run_dir / "attempts" / str(attempt)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    resolved = attempt_dir / "resolved.yaml"
    resolved.write_text(yaml.safe_dump(doc), encoding="utf-8")
    launch = gang_launch(
        spec,
        runner_program(sys.executable, resolved, run_dir, attempt),
        [],
        attempt_dir=attempt_dir,
        python=sys.executable,
        cpu_count=os.cpu_count() or 1,
    )
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(spec.env)
    full_env.update(env or {})
    full_env.update(launch.env)
    child = spawn(
        launch.argv, full_env, run_dir, attempt_dir / "stdout.log", attempt_dir / "stderr.log", limit
    )
    return Gang(child, attempt_dir, time.time())


def wait_for(gang: Gang, rank: int, predicate: Any, timeout: float) -> dict[str, Any]:
    """The first event of `rank` that satisfies `predicate`, polling until `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in gang.events().get(rank, []):
            if predicate(event):
                return event
        if gang.child.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"rank {rank}: no matching event\n{gang.events()}\n{gang.stderr()[-3000:]}")
