"""`tune` against an exhaustive sweep, both with real probe processes of the training runner,
measured in the same run.

The sweep probes every micro-batch that keeps the effective batch (on a GPU, each also with the
precisions and compile settings tune tries there); the search starts where a user would
(micro-batch 4, the spec's precision, no compile). Sweep rounds and searches alternate, `REPEATS`
of each (sweep round, search, sweep round, search, …), so a change of the machine's load weighs
on both: a sweep cached from another hour once made a cold run's figures say nothing. Each
configuration's figure is the median of its sweep readings; a pick is scored by its own
configuration's figure against the best one's (`tune_report.py`, which also says when the
readings spread too much for a verdict). Targets, on the medians: the pick's samples/s ≥ 95 % of
the sweep's best, in ≤ 1/3 of a sweep round's time.

A GPU check runs the sweep as a step of its own (`sweep()`, kept in `.bench/tune-sweep.json`);
the searches' step then uses that sweep, when fresh, as its first round and names when it was
measured.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import tune_report
from bench.figures import REPEATS, main_for
from bench.tune_report import SearchRun
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate, Search, divisors
from gpuwarden.core.tune.target import Target, pick_target

PINNED = {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
SWEEP_FILE = Path(".bench") / "tune-sweep.json"
# A saved sweep serves as the first round only this soon after it was measured (a GPU check runs
# the sweep and the searches as consecutive steps); the report names when it was.
SWEEP_FRESH_S = 3600.0
# (effective batch, image model). CPU: a tiny model, the 20 divisors of 240. GPU: a model that
# gives the card work, and 64 so that micro-batch × precision × compile stays a sweep of 28 probes.
CPU_SETUP: tuple[int, dict[str, int]] = (240, {"base_channels": 16, "num_blocks": 2, "patch_size": 32})
GPU_SETUP: tuple[int, dict[str, int]] = (64, {"base_channels": 96, "num_blocks": 6, "patch_size": 96})


def _gpus() -> list[Any]:
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        return reader.gpus() if not os.environ.get("GPUWARDEN_FAKE_NVML") else []
    finally:
        reader.close()


def setup() -> tuple[RunSpec, Target, int]:
    """The spec tuned, where it runs, and the effective batch kept."""
    gpus = _gpus()
    effective, image = GPU_SETUP if gpus else CPU_SETUP
    spec = spec_from_mapping(
        {
            "name": "bench-tune",
            "kind": "train",
            "env": {} if gpus else PINNED,
            "resources": {"gpus": 1 if gpus else 0},
            "train": {
                "task": "image",
                "image": {**image, "synthetic_samples": 4096},
                "batch_size": 4,
                "grad_accum_steps": effective // 4,
                "precision": "fp32",
            },
        }
    )
    return spec, pick_target(spec, gpus), effective


def _prober(spec: RunSpec, target: Target, work: Path, measure_steps: int = 3) -> SubprocessProber:
    # The sweep and the searches probe alike: 1 warm-up step, 3 measured.
    pinned = PINNED if target.device["type"] == "cpu" else {}
    env = {**os.environ, **pinned, **target.env}
    return SubprocessProber(spec, work, env=env, warmup_steps=1, measure_steps=measure_steps)


def _space(target: Target, effective: int) -> list[Candidate]:
    precisions = ["fp32", *[p for p in target.precisions if p != "fp32"]]
    compiles = [False, *[c for c in target.compile_options if c]]
    return [
        Candidate(b, effective // b, p, c) for b in divisors(effective) for p in precisions for c in compiles
    ]


def sweep() -> dict[str, Any]:
    """Probe the whole space once (or reuse the sweep saved for this setup)."""
    spec, target, effective = setup()
    fresh = _saved_sweep(spec, target)
    if fresh is not None:
        return fresh
    work = Path(tempfile.mkdtemp(prefix="bench-tune-sweep-"))
    try:
        results = _sweep_round(spec, target, effective, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    key = {"device": target.device, "spec": spec.model_dump(mode="json")}
    saved = {"key": key, "time": time.time(), "results": results}
    SWEEP_FILE.parent.mkdir(exist_ok=True)
    SWEEP_FILE.write_text(json.dumps(saved, indent=2))
    return saved


def _candidate(d: dict[str, Any]) -> Candidate:
    return Candidate(d["batch_size"], d["grad_accum_steps"], d["precision"], d["compile"])


def _name(c: Candidate, target: Target) -> str:
    """A configuration as the report names it: the micro-batch, and on a GPU what else varies."""
    return f"{c.batch_size}{f' {c.precision}' if target.precisions else ''}{', compile' if c.compile else ''}"


def _saved_sweep(spec: RunSpec, target: Target) -> dict[str, Any] | None:
    """The sweep the GPU check's own step saved for this setup, when fresh."""
    if not SWEEP_FILE.exists():
        return None
    saved = json.loads(SWEEP_FILE.read_text())
    key = {"device": target.device, "spec": spec.model_dump(mode="json")}
    if saved.get("key") == key and time.time() - float(saved.get("time", 0)) < SWEEP_FRESH_S:
        return dict(saved)
    return None


def _sweep_round(spec: RunSpec, target: Target, effective: int, work: Path) -> list[dict[str, Any]]:
    """Every configuration probed once."""
    probe = _prober(spec, target, work)
    return [probe(c).to_dict() for c in _space(target, effective)]


def _as_round(results: list[dict[str, Any]], target: Target) -> tuple[dict[str, float | None], float]:
    """(configuration name → samples/s or None, the round's probe time)."""
    rates = {
        _name(_candidate(r["candidate"]), target): (r["samples_per_s"] if r["ok"] else None) for r in results
    }
    return rates, sum(float(r["wall_s"]) for r in results)


def _search(spec: RunSpec, target: Target, effective: int, work: Path) -> SearchRun:
    # On the CPU the memory that matters is the host's, which the tiny model never nears.
    capacity = target.capacity if target.device["type"] == "cuda" else None
    result = Search(_prober(spec, target, work), capacity=capacity).run(
        Candidate(4, effective // 4, "fp32", False),
        per_device_batch=effective,
        precisions=target.precisions,
        compile_options=target.compile_options,
    )
    assert result.best is not None, result.stopped_because
    return SearchRun(
        _name(result.best.candidate, target),
        result.wall_s,
        len(result.trials),
        result.uncertain,
        result.noise.get("repeat_spread"),
    )


def _say(line: str) -> None:
    """Progress on stderr: a round on a loaded CPU takes minutes."""
    print(f"  tune: {line}", file=sys.stderr, flush=True)


def run() -> list[dict[str, Any]]:
    spec, target, effective = setup()
    saved = _saved_sweep(spec, target)
    rounds: list[dict[str, float | None]] = []
    walls: list[float] = []
    searches: list[SearchRun] = []
    work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    try:
        for rep in range(REPEATS):
            results = (
                saved["results"]
                if rep == 0 and saved is not None
                else _sweep_round(spec, target, effective, work / f"sweep-{rep}")
            )
            rates, wall = _as_round(results, target)
            rounds.append(rates)
            walls.append(wall)
            _say(f"sweep round {rep + 1}: {len(results)} probes, {wall:.0f} s")
            searches.append(_search(spec, target, effective, work / f"search-{rep}"))
            found = searches[-1]
            _say(f"search {rep + 1}: picked {found.pick} in {found.probes} probes, {found.wall_s:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    space = f"{len(rounds[0])} configurations" + (", precision and compile" if target.precisions else "")
    measured = f"effective batch {effective}; sweep rounds and searches alternated in this run"
    if saved is not None:
        when = time.strftime("%H:%M UTC", time.gmtime(float(saved["time"])))
        measured += f", its first sweep round the GPU check's, measured at {when}"
    return tune_report.rows(rounds, walls, searches, space=space, measured=measured)


if __name__ == "__main__":
    raise SystemExit(main_for(run))
