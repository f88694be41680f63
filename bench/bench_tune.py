"""`tune` against an exhaustive sweep, both with real probe processes of the training runner.

The sweep probes every micro-batch from the one tune starts at (4) up to the effective batch,
each keeping it (on a GPU, each also with the precisions and compile settings tune tries there);
tune goes below its start only when the start does not fit, so smaller micro-batches are outside
both, and a row checks that the sweep's best is not at the grid's lower edge (else the grid would
be too small to prove anything). The search starts where a user would (micro-batch 4, the spec's
precision, no compile) and runs `REPEATS` times. Targets, on the median of those searches: the
pick's samples/s ≥ 95 % of the sweep's best, in ≤ 1/3 of the sweep's time.

The sweep's best is the highest of many noisy readings, so it reads high by chance (the winner's
curse): the picks and the sweep's best are therefore measured again, interleaved, `REPEATS` times
each, and compared on their medians — each distinct configuration once, however many searches
picked it. So the throughput row rests on readings of one run, taken in turns, whatever the load
was when the sweep ran; a row whose readings spread more than its comparison can resolve says so
instead of a verdict (`tune_report.py`). The sweep is kept in `.bench/tune-sweep.json` for the
same setup (the row says when it was measured), so a GPU check can run it as its own step and
the searches as the next one inside one short GPU window each.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import tune_report
from bench.figures import REPEATS, figure_row, main_for
from bench.tune_report import SearchRun
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate, ProbeResult, Search, TuneResult, divisors
from gpuwarden.core.tune.target import Target, pick_target

PINNED = {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
SWEEP_FILE = Path(".bench") / "tune-sweep.json"
# A saved sweep is reused only this soon after it was measured: the searches must be compared
# with a sweep taken under the same conditions (a GPU check runs the two as consecutive steps).
SWEEP_FRESH_S = 3600.0
# Where tune's search starts: the sweep covers the micro-batches from here up.
START_BATCH = 4
# (effective batch, image model). CPU: a tiny model, the 17 divisors of 240 from 4. GPU: a model
# that gives the card work, and 64 so that micro-batch (4 to 64) × precision × compile stays a
# sweep of 20 probes.
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
        Candidate(b, effective // b, p, c)
        for b in divisors(effective)
        if b >= START_BATCH
        for p in precisions
        for c in compiles
    ]


def sweep() -> dict[str, Any]:
    """Probe the whole space once (or reuse the sweep saved for this setup)."""
    spec, target, effective = setup()
    key = {"device": target.device, "spec": spec.model_dump(mode="json")}
    if SWEEP_FILE.exists():
        saved = json.loads(SWEEP_FILE.read_text())
        if saved.get("key") == key and time.time() - float(saved.get("time", 0)) < SWEEP_FRESH_S:
            return dict(saved)
    work = Path(tempfile.mkdtemp(prefix="bench-tune-sweep-"))
    try:
        probe = _prober(spec, target, work)
        results = [probe(c).to_dict() for c in _space(target, effective)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    saved = {"key": key, "time": time.time(), "results": results}
    SWEEP_FILE.parent.mkdir(exist_ok=True)
    SWEEP_FILE.write_text(json.dumps(saved, indent=2))
    return saved


def _candidate(d: dict[str, Any]) -> Candidate:
    return Candidate(d["batch_size"], d["grad_accum_steps"], d["precision"], d["compile"])


def _rate(r: ProbeResult) -> float:
    if not r.ok or not r.samples_per_s:
        raise RuntimeError(f"a re-measure failed: {r.error or 'no throughput'} ({r.candidate})")
    return r.samples_per_s


def _searches(spec: RunSpec, target: Target, effective: int, work: Path) -> list[TuneResult]:
    """`REPEATS` searches from where a user starts."""
    results = []
    for rep in range(REPEATS):
        # On the CPU the memory that matters is the host's, which the tiny model never nears.
        capacity = target.capacity if target.device["type"] == "cuda" else None
        search = Search(_prober(spec, target, work / f"search-{rep}"), capacity=capacity)
        result = search.run(
            Candidate(START_BATCH, effective // START_BATCH, "fp32", False),
            per_device_batch=effective,
            precisions=target.precisions,
            compile_options=target.compile_options,
        )
        assert result.best is not None, result.stopped_because
        results.append(result)
    return results


def run() -> list[dict[str, Any]]:
    spec, target, effective = setup()
    saved = sweep()
    swept = saved["results"]
    ok = [r for r in swept if r["ok"] and r["samples_per_s"]]
    best_c = _candidate(max(ok, key=lambda r: r["samples_per_s"])["candidate"])
    sweep_time = sum(float(r["wall_s"]) for r in swept)
    work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    try:
        searches = _searches(spec, target, effective, work)
        picks = [r.best.candidate for r in searches if r.best is not None]
        rates = _remeasured(spec, target, work / "again", [best_c, *picks])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rounds = [{_name(c, target): readings[i] for c, readings in rates.items()} for i in range(_count(rates))]
    runs = [_search_run(r, target) for r in searches]
    space = f"{len(swept)} configurations" + (", precision and compile" if target.precisions else "")
    when = time.strftime("%H:%M UTC", time.gmtime(float(saved["time"])))
    measured = (
        f"effective batch {effective}; the picks and the sweep's best ({_name(best_c, target)}) "
        f"re-measured {REPEATS}× in turns in this run; the sweep measured at {when}"
    )
    rows = tune_report.rows(
        rounds, [sweep_time], runs, space=space, measured=measured, configurations=len(swept)
    )
    return [*rows, _inside_grid(swept, best_c)]


def _count(rates: dict[Candidate, list[float]]) -> int:
    return min(len(readings) for readings in rates.values())


def _name(c: Candidate, target: Target) -> str:
    """A configuration as the report names it: the micro-batch, and on a GPU what else varies."""
    return f"{c.batch_size}{f' {c.precision}' if target.precisions else ''}{', compile' if c.compile else ''}"


def _search_run(result: TuneResult, target: Target) -> SearchRun:
    assert result.best is not None, result.stopped_because
    return SearchRun(
        _name(result.best.candidate, target),
        result.wall_s,
        len(result.trials),
        result.uncertain,
        result.noise.get("repeat_spread"),
    )


def _inside_grid(swept: list[dict[str, Any]], best: Candidate) -> dict[str, Any]:
    """The sweep's best above the grid's smallest micro-batch: a best at the edge would leave the
    smaller ones, which the grid omits, unexplored."""
    smallest = min(int(r["candidate"]["batch_size"]) for r in swept)
    return figure_row(
        f"sweep's best micro-batch (the grid starts at {smallest})",
        [float(best.batch_size)] * REPEATS,
        "",
        target=f"> {smallest}",
        check=lambda v: v > smallest,
    )


def _remeasured(
    spec: RunSpec, target: Target, work: Path, candidates: list[Candidate]
) -> dict[Candidate, list[float]]:
    """Samples/s of each distinct candidate, `REPEATS` readings each, taken in turns — once per
    configuration however many searches picked it. These are the benchmark's measuring
    instrument, not part of tune: longer runs (10 measured steps) read steadier than the short
    probes the search is timed with."""
    distinct = list(dict.fromkeys(candidates))
    if len(distinct) == 1:  # every search picked the sweep's best: nothing to compare
        return {distinct[0]: [1.0]}
    probe = _prober(spec, target, work, measure_steps=10)
    rates: dict[Candidate, list[float]] = {c: [] for c in distinct}
    for _ in range(REPEATS):
        for c in distinct:
            rates[c].append(_rate(probe(c)))
    return rates


if __name__ == "__main__":
    raise SystemExit(main_for(run))
