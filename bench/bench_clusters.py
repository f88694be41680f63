"""gpuwarden inside a cluster job: how long a run is away from its work when something stops it.

- OOM → running again inside the job: `gpuwarden exec configs/examples/oom-recovery-cpu.yaml`
  (micro-batch 32 under a 1.4 GiB address-space limit: torch's allocator fails for real); from
  the `oom` event to attempt 2's `running` state, which includes the retune's two probes. The
  same run under the daemon takes the same path; no requeue and no queue wait either way.
- Time limit → running again after the requeue (needs a Slurm: `.ci/slurm-up`): a training run
  longer than its job, submitted with `gpuwarden slurm submit --time 2:00 --signal-lead 75`; from
  the `stopping` event (SIGUSR1 received) to the job pending again (the step in progress, a
  checkpoint, the exit, `scontrol requeue`), and from the job's release
  (`release_begin_time`: `scontrol update StartTime=now` after 1.1 s, as slurmd refuses a
  credential made in the second its last run was killed; Slurm would otherwise hold a requeued job
  back for a while, `BeginTime`) to attempt 2's `running` state. The queue's own wait is the
  cluster's, not counted.
- A gang stopped across machines: `configs/examples/ddp-oom-recovery-cpu.yaml` over two
  "machines" (two `gpuwarden exec --nodes 2` on this host, node ranks 0 and 1, the rendezvous on
  127.0.0.1): rank 1, on node 1, runs out of memory for real; from its `oom` event to attempt
  1's end (node 0 ends it once both machines' torchrun have ended: its own, and node 1's as
  node 1's exit recorder wrote it), and from the `oom` event to attempt 2 running on both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.slurm.scheduler import release_begin_time

REPO = Path(__file__).resolve().parents[1]
OOM_SPEC = REPO / "configs" / "examples" / "oom-recovery-cpu.yaml"
NODES_SPEC = REPO / "configs" / "examples" / "ddp-oom-recovery-cpu.yaml"
# Trains for longer than its job's 2 minutes: the warning lands mid-step, and the figure is what a
# real run's stop costs (the step it is in, a checkpoint, the exit).
LONG = """
name: long
kind: train
env: {OMP_NUM_THREADS: "1"}
resources: {gpus: 0}
train:
  task: image
  batch_size: 4
  max_steps: 100000
  log_interval: 10
  checkpoint_interval: 200
  image: {base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 64}
"""


def _env(root: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_", "SLURM_"))},
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_STATE_HOME": str(root / "state"),
        "PYTHONPATH": str(REPO),
    }


def _gw(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        env=_env(root),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _events(root: Path, run_id: str) -> list[dict[str, Any]]:
    done = _gw(root, "events", "--runs", str(root / "runs"), run_id, "--json", timeout=60)
    events: list[dict[str, Any]] = json.loads(done.stdout)["events"] if done.returncode == 0 else []
    return events


def _first(events: list[dict[str, Any]], match: Callable[[dict[str, Any]], bool]) -> float:
    return float(next(e["ts"] for e in events if match(e)))


def _running(attempt: int) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == "state" and e.get("state") == "running" and e.get("attempt") == attempt


def _oom_to_running(root: Path) -> float:
    done = _gw(root, "exec", str(OOM_SPEC), "--runs", str(root / "runs"))
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    (run_id,) = [p.name for p in (root / "runs").iterdir()]
    events = _events(root, run_id)
    return _first(events, _running(2)) - _first(events, lambda e: e["type"] == "oom")


def _two_machines(root: Path) -> tuple[float, float]:
    """(rank 1's oom → every machine's ranks stopped, oom → attempt 2 running), seconds."""
    from gpuwarden.core.gang.nodes import node_exit_path
    from gpuwarden.runners.testing_models import build_example_assets

    (root / "configs" / "examples").mkdir(parents=True)
    shutil.copy(NODES_SPEC, root / "configs" / "examples")
    build_example_assets(root / ".example-models")
    spec, folder = str(root / "configs" / "examples" / NODES_SPEC.name), root / "runs" / "two"
    common = ["exec", spec, "--run", str(folder), "--nodes", "2"]
    argv = [sys.executable, "-m", "gpuwarden", *common]
    follower = subprocess.Popen(
        [*argv, "--node-rank", "1"],
        env=_env(root),
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = _gw(root, *common, "--node-rank", "0", "--rendezvous-host", "127.0.0.1")
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
    finally:
        follower.wait(timeout=120)
    listed = json.loads(_gw(root, "ps", "--runs", str(root / "runs"), "--json").stdout)["runs"]
    (run_id,) = [r["id"] for r in listed]
    events = _events(root, run_id)
    oom = _first(events, lambda e: e["type"] == "oom")
    shown = json.loads(_gw(root, "show", "--runs", str(root / "runs"), run_id, "--json").stdout)
    if not node_exit_path(folder / "attempts" / "1", 1).is_file():
        raise RuntimeError("node 1 did not record how its part of attempt 1 ended")
    return float(shown["attempts"][0]["ended_at"]) - oom, _first(events, _running(2)) - oom


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    answer = subprocess.run(
        ["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=20
    )
    return answer.returncode == 0 and any(s.startswith(("idle", "mix")) for s in answer.stdout.split())


def _squeue(job_id: int) -> tuple[str, str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%T|%r", "--jobs", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def _wait(check: Callable[[], bool], timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("gave up waiting")
        time.sleep(0.1)
    return time.time()


def _time_limit_requeue(root: Path) -> tuple[float, float]:
    """(stop → pending again, release → running again), seconds."""
    spec = root / "long.yaml"
    spec.write_text(LONG)
    done = _gw(
        root,
        "slurm",
        "submit",
        "--runs",
        str(root / "runs"),
        "--json",
        str(spec),
        "--time",
        "2:00",
        "--signal-lead",
        "75",
    )
    answer = json.loads(done.stdout)
    job_id, run_id = int(answer["job_id"]), str(answer["run_id"])
    pending_at = _wait(lambda: _squeue(job_id) == ("PENDING", "BeginTime"))
    stopping_at = _first(_events(root, run_id), lambda e: e["type"] == "stopping")
    released_at = time.time()
    release_begin_time(job_id)
    _wait(lambda: any(_running(2)(e) for e in _events(root, run_id)), timeout=300)
    running_again = _first(_events(root, run_id), _running(2))
    subprocess.run(["scancel", str(job_id)], check=True, timeout=30)  # the figure is taken
    _wait(lambda: _squeue(job_id)[0] in ("CANCELLED", "COMPLETED", "FAILED", ""), timeout=120)
    return pending_at - stopping_at, running_again - released_at


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    (oom,) = _repeated(lambda root: (_oom_to_running(root),))
    rows.append(figure_row("gpuwarden exec: OOM → running again inside the job (2 probes)", oom, "s"))
    stops, resumed = _repeated(_two_machines)
    rows.append(figure_row("two machines: a rank's OOM → every machine's ranks stopped", stops, "s"))
    rows.append(figure_row("two machines: a rank's OOM → attempt 2 running on both", resumed, "s"))
    if not _slurm_up():
        rows.append(
            {
                "benchmark": "Slurm time limit → requeue: no Slurm here (.ci/slurm-up)",
                "value": "",
                "unit": "",
                "target": "",
                "ok": None,
            }
        )
        return rows
    requeued, again = _repeated(_time_limit_requeue)
    rows.append(figure_row("Slurm time limit: stop at a checkpoint → job pending again", requeued, "s"))
    rows.append(figure_row("Slurm requeue: job released → running again from the checkpoint", again, "s"))
    return rows


def _repeated(measure: Callable[[Path], tuple[float, ...]]) -> list[list[float]]:
    """`measure` REPEATS times, each in a fresh folder; its figures by position."""
    figures: list[list[float]] = []
    for _ in range(REPEATS):
        root = Path(tempfile.mkdtemp(prefix="bench-clusters-"))
        try:
            taken = measure(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        figures = figures or [[] for _ in taken]
        for column, value in zip(figures, taken, strict=True):
            column.append(value)
    return figures


if __name__ == "__main__":
    sys.exit(main_for(run))
