"""Two-rank gangs on the CPU through a real daemon (`gpuwarden run`), against plain torchrun.

1. One rank runs out of memory for real (`configs/examples/ddp-oom-recovery-cpu.yaml`: rank 1
   alone meets long texts under the 1.35 GiB address-space limit every rank gets): time from its
   `oom` event to torchrun and both ranks gone, watched from outside every 10 ms. Median of 3.
2. One rank stalls after step 5 (the runner's stall test hook: alive, no progress): time from its
   last progress to the whole gang gone, with the watchdog's floor at 10 s (`hang.min_seconds`;
   the default is 120 s), and the bound the daemon computed. Median of 3.
3. Wall time of the recovered example (OOM, probes, retune, resume from the step-3 checkpoint)
   against the same run without the limit (uninterrupted), submit to `succeeded`. Median of 3.
Every run has the 60 s collective timeout of the plain torchrun runs of `bench_gang.py`, which
measures the same OOM and stall under plain torchrun.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from gpuwarden.client import ApiClient
from gpuwarden.core.errors import UserError
from gpuwarden.runners.testing_models import build_example_assets, build_tiny_causal_lm, write_text_dataset
from gpuwarden.runners.train.stall_hook import STALL_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "examples" / "ddp-oom-recovery-cpu.yaml"
REPEATS = 3
POLL_S = 0.01
FLOOR_S = 10.0
COLLECTIVE_TIMEOUT = 60  # the same as bench_gang.py's plain torchrun runs


class _Daemon:
    """A daemon in private XDG directories (the runtime one short: socket paths are limited)."""

    def __init__(self, root: Path) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="gwb", dir="/tmp"))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))},
            "XDG_CONFIG_HOME": str(root / "c"),
            "XDG_STATE_HOME": str(root / "s"),
            "XDG_RUNTIME_DIR": str(self.runtime),
            "GPUWARDEN_FAKE_NVML": "none",
            "PYTHONPATH": str(REPO),
        }
        self.socket = self.runtime / "gpuwarden" / "api.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "daemon"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with self.client() as client:
                    client.health()
                return
            except UserError:
                time.sleep(0.05)
        raise RuntimeError("the daemon did not come up")

    def client(self) -> ApiClient:
        return ApiClient(self.socket, timeout=30)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.runtime, ignore_errors=True)


def _events(client: ApiClient, run_id: str, type_: str) -> list[dict[str, Any]]:
    page = client.events(run_id, since=0, limit=10_000)
    return [e.model_dump(mode="json") for e in page.events if e.type == type_]


def _wait(client: ApiClient, run_id: str, what: str, check: Any, timeout: float = 900) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if client.run(run_id).state in ("succeeded", "failed", "stopped"):
            value = check()
            if value:
                return value
            raise RuntimeError(f"run {run_id} ended before {what}: {client.run(run_id).message}")
        time.sleep(0.05)
    raise RuntimeError(f"gave up waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _gone_at(client: ApiClient, run_id: str) -> float:
    """When torchrun and both ranks of attempt 1 were all gone (watched from outside)."""

    def pids() -> list[int] | None:
        detail = client.run(run_id)
        started = [e for e in _events(client, run_id, "started") if e["attempt"] == 1]
        if not detail.attempts or len(started) < 2:
            return None
        return [int(detail.attempts[0].pid or 0), *(int(e["pid"]) for e in started)]

    watched: list[int] = _wait(client, run_id, "both ranks started", pids)
    while any(_alive(pid) for pid in watched):
        time.sleep(POLL_S)
    return time.time()


def _wall(client: ApiClient, run_id: str) -> float:
    _wait(client, run_id, "the end", lambda: client.run(run_id).state == "succeeded")
    run = client.run(run_id)
    assert run.ended_at is not None
    return run.ended_at - run.created_at


def _example(tree: Path, *, limited: bool, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["name"] = name
    doc["train"]["collective_timeout"] = COLLECTIVE_TIMEOUT  # as under plain torchrun
    for key in ("model", "data"):
        doc["train"][key] = str(tree / Path(doc["train"][key]).relative_to("../../"))
    if not limited:
        doc["resources"].pop("memory_limit")
    return doc


def _oom_and_walls(gw: _Daemon, tree: Path) -> tuple[list[float], list[float], list[float]]:
    oom_to_gone, recovered, uninterrupted = [], [], []
    with gw.client() as client:
        for i in range(REPEATS):
            run_id = client.submit(_example(tree, limited=True, name=f"oom-{i}")).id
            gone = _gone_at(client, run_id)
            (oom,) = [e for e in _events(client, run_id, "oom") if e["attempt"] == 1]
            oom_to_gone.append(gone - float(oom["ts"]))
            recovered.append(_wall(client, run_id))
            reference = client.submit(_example(tree, limited=False, name=f"reference-{i}")).id
            uninterrupted.append(_wall(client, reference))
    return oom_to_gone, recovered, uninterrupted


def _stall_spec(model: Path, texts: Path, i: int) -> dict[str, Any]:
    return {
        "name": f"stall-{i}",
        "kind": "train",
        "env": {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", STALL_ENV: "1:5"},
        "resources": {"gpus": 0},
        "policy": {"base": "default", "hang": {"min_seconds": FLOOR_S}},
        "train": {
            "task": "causal_lm",
            "model": str(model),
            "data": str(texts),
            "max_length": 32,
            "batch_size": 2,
            "world_size": 2,
            "max_steps": 8,
            "log_interval": 1,
            "collective_timeout": COLLECTIVE_TIMEOUT,
        },
    }


def _stalls(gw: _Daemon, model: Path, texts: Path) -> tuple[list[float], list[float]]:
    to_gone, bounds = [], []
    with gw.client() as client:
        for i in range(REPEATS):
            run_id = client.submit(_stall_spec(model, texts, i)).id
            gone = _gone_at(client, run_id)
            last = max(
                float(e["ts"])
                for e in _events(client, run_id, "progress")
                if e["rank"] == 1 and e["attempt"] == 1
            )
            to_gone.append(gone - last)
            (hang,) = _wait(client, run_id, "the hang event", lambda rid=run_id: _events(client, rid, "hang"))
            bounds.append(float(hang["bound_s"]))
            _wait(client, run_id, "the end", lambda rid=run_id: client.run(rid).state == "failed")
    return to_gone, bounds


def _fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def run() -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="bench-gang-daemon-"))
    gw = _Daemon(work / "daemon")
    try:
        tree = work / "tree"
        build_example_assets(tree / ".example-models")
        small = build_tiny_causal_lm(work / "small", hidden=64, layers=1, vocab=512, seed=0)
        texts = write_text_dataset(work / "texts.jsonl", 200, seed=1)
        oom, recovered, uninterrupted = _oom_and_walls(gw, tree)
        stall, bounds = _stalls(gw, small, texts)
    finally:
        gw.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows: list[tuple[str, Any, str]] = [
        ("rank 1 OOM → torchrun and both ranks gone (gpuwarden daemon)", statistics.median(oom), "s"),
        ("  each run", _fmt(oom), "s"),
        (
            f"rank 1 stalled → gang gone (gpuwarden, hang.min_seconds {FLOOR_S:g})",
            statistics.median(stall),
            "s",
        ),
        ("  each run", _fmt(stall), "s"),
        ("  the watchdog's bound in those runs", _fmt(bounds), "s"),
        ("recovered 2-rank example: submit → succeeded", statistics.median(recovered), "s"),
        ("  each run", _fmt(recovered), "s"),
        ("same run without the limit (uninterrupted)", statistics.median(uninterrupted), "s"),
        ("  each run", _fmt(uninterrupted), "s"),
        ("recovered / uninterrupted", statistics.median(recovered) / statistics.median(uninterrupted), "×"),
    ]
    return [{"benchmark": n, "value": v, "unit": u, "target": "info", "ok": None} for n, v, u in rows]
