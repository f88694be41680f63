"""Two-rank training gangs on the CPU under plain torchrun (no daemon), started with the command
the daemon uses (`gpuwarden.core.gang.launch`).

1. One rank runs out of memory for real (an address-space limit only its data shape exceeds):
   time from its `oom` event to the whole gang stopped (torchrun exited), with a 60 s collective
   timeout. Median of 3.
2. One rank stalls (the runner's test hook: alive, no progress), as a hung rank would: time from
   its last step to the whole gang stopped under the same torchrun. Once: it is two timeouts.
3. The same run (effective batch 16, 24 steps) as one process and as a 2-rank gang: wall time of
   the whole attempt and of the training loop. Median of 3 each.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.events import EXIT_OK, decode
from gpuwarden.core.gang.files import rank_event_files
from gpuwarden.core.gang.launch import gang_launch, runner_program
from gpuwarden.daemon.process import spawn
from gpuwarden.runners.testing_models import build_tiny_causal_lm, write_shaped_texts, write_text_dataset
from gpuwarden.runners.train.stall_hook import STALL_ENV

REPO = Path(__file__).resolve().parents[1]
PINNED = {"MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false"}
LIMIT = int(1.35 * 2**30)  # rank 1's long step at micro-batch 8 needs ~1.7 GB, the rest ~1.0 GB
COLLECTIVE_TIMEOUT = 60
REPEATS = 3


def _events(attempt_dir: Path) -> dict[int, list[dict[str, Any]]]:
    files = rank_event_files(attempt_dir / "events.jsonl")
    return {r: [e for e in map(decode, p.read_text().splitlines()) if e] for r, p in files.items()}


def _attempt(
    run_dir: Path, train: dict[str, Any], *, limit: int | None = None, env: dict[str, str] | None = None
) -> tuple[int | None, float, float, dict[int, list[dict[str, Any]]]]:
    """One attempt (torchrun when world_size > 1), as the daemon starts it; (exit code, start,
    end, events by rank)."""
    doc: dict[str, Any] = {
        "name": "bench-gang",
        "kind": "train",
        "env": PINNED,
        "resources": {"gpus": 0, **({"memory_limit": limit} if limit else {})},
        "train": train,
    }
    spec = spec_from_mapping(doc)
    attempt_dir = run_dir / "attempts" / "1"
    attempt_dir.mkdir(parents=True)
    resolved = attempt_dir / "resolved.yaml"
    resolved.write_text(yaml.safe_dump(doc))
    program = runner_program(sys.executable, resolved, run_dir, 1)
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **PINNED, **(env or {})}
    if train.get("world_size", 1) > 1:
        launch = gang_launch(
            spec, program, [], attempt_dir=attempt_dir, python=sys.executable, cpu_count=os.cpu_count() or 1
        )
        argv, full_env = launch.argv, {**full_env, **launch.env}
    else:
        argv = [sys.executable, "-m", program.target, *program.args]
    start = time.time()
    child = spawn(argv, full_env, run_dir, attempt_dir / "stdout.log", attempt_dir / "stderr.log", limit)
    while (status := child.poll()) is None:
        time.sleep(0.01)
    return status.code, start, time.time(), _events(attempt_dir)


def _lm_section(model: Path, texts: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "task": "causal_lm",
        "model": str(model),
        "data": str(texts),
        "max_length": 256,
        "batch_size": 8,
        "world_size": 2,
        "max_steps": 6,
        "log_interval": 1,
        "checkpoint_interval": 3,
        "collective_timeout": COLLECTIVE_TIMEOUT,
        "seed": 3,
        **overrides,
    }


def _oom_to_stopped(work: Path, model: Path, texts: Path) -> list[float]:
    seconds = []
    for i in range(REPEATS):
        code, _, end, events = _attempt(work / f"oom-{i}", _lm_section(model, texts), limit=LIMIT)
        oom = [e for e in events.get(1, []) if e["type"] == "oom"]
        if code == EXIT_OK or not oom:
            raise RuntimeError(f"rank 1 did not run out of memory (exit {code})")
        seconds.append(end - oom[0]["ts"])
    return seconds


def _stall_to_stopped(work: Path, model: Path, texts: Path) -> float:
    _, _, end, events = _attempt(work / "stall", _lm_section(model, texts), env={STALL_ENV: "1:2"})
    last = max(float(e["ts"]) for e in events[1] if e["type"] == "progress")
    return float(end) - last


SHAPES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "1 process, 1 thread": ({"world_size": 1, "grad_accum_steps": 2}, {"OMP_NUM_THREADS": "1"}),
    "1 process, a thread per core": ({"world_size": 1, "grad_accum_steps": 2}, {}),
    "2 ranks, 1 thread each": ({"world_size": 2}, {}),  # the launch shares the cores out
}


def _solo_vs_gang(work: Path, model: Path, texts: Path) -> dict[str, list[tuple[float, float]]]:
    base = {"max_length": 64, "max_steps": 24, "log_interval": 8, "checkpoint_interval": 10**6}
    walls: dict[str, list[tuple[float, float]]] = {name: [] for name in SHAPES}
    for i in range(REPEATS):
        for name, (shape, env) in SHAPES.items():
            section = _lm_section(model, texts, **base, **shape)
            code, start, end, events = _attempt(work / f"{name}-{i}".replace(" ", "_"), section, env=env)
            if code != EXIT_OK:
                raise RuntimeError(f"{name} run failed (exit {code})")
            report = next(e for e in events[0] if e["type"] == "finished")["report"]
            walls[name].append((end - start, float(report["wall_s"])))
    return walls


def _rows(
    oom: list[float], stall: float, walls: dict[str, list[tuple[float, float]]]
) -> list[tuple[str, Any, str]]:
    whole = {name: statistics.median(w for w, _ in runs) for name, runs in walls.items()}
    loop = {name: statistics.median(t for _, t in runs) for name, runs in walls.items()}
    solo, gang = "1 process, 1 thread", "2 ranks, 1 thread each"
    timeout = f"plain torchrun, {COLLECTIVE_TIMEOUT} s collective timeout"
    return [
        (f"rank 1 OOM → gang stopped ({timeout})", statistics.median(oom), "s"),
        ("  each run", " / ".join(f"{s:.2f}" for s in oom), "s"),
        (f"rank 1 stalled → gang stopped ({timeout}; once)", stall, "s"),
        *(
            (f"same run, {name}: whole attempt / loop", f"{whole[name]:.1f} / {loop[name]:.2f}", "s")
            for name in SHAPES
        ),
        (
            f"{gang} / {solo}: whole attempt, loop",
            f"{whole[gang] / whole[solo]:.2f}, {loop[gang] / loop[solo]:.2f}",
            "×",
        ),
    ]


def run() -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="bench-gang-"))
    try:
        wide = build_tiny_causal_lm(work / "wide", hidden=64, layers=1, vocab=32000, seed=0)
        shaped = write_shaped_texts(
            work / "shaped.jsonl", n=96, seed=3, per_rank=8, world_size=2, long_step=4, long_rank=1
        )
        small = build_tiny_causal_lm(work / "small", hidden=64, layers=2, vocab=512, seed=0)
        texts = write_text_dataset(work / "texts.jsonl", 400, seed=1)
        oom = _oom_to_stopped(work, wide, shaped)
        stall = _stall_to_stopped(work, wide, shaped)
        walls = _solo_vs_gang(work, small, texts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [
        {"benchmark": name, "value": value, "unit": unit, "target": "info", "ok": None}
        for name, value, unit in _rows(oom, stall, walls)
    ]
