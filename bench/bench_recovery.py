"""OOM recovery and tuning, measured with real runner processes under a real memory limit.

1. From a micro-batch 8× too large (128 where 16 fits under a 1.6 GiB address-space limit):
   restarts and wall time until an attempt runs — gpuwarden (classify, probe, memory model)
   against halving and against ×0.9 (accelerate's default). Target: gpuwarden ≤ 2 restarts.
2. The size gpuwarden chose against the largest divisor of 128 that runs under the limit (found
   once by trying each, largest first). Target ≥ 90 %.
3. Probe processes and the recovery's cost beyond the attempt that runs (probes, decision), in
   start-ups of the runner (that attempt's seconds): the first time a shape runs out of memory,
   and again with the sizes the first time measured remembered. Targets: ≤ 1 probe process the
   first time (one process loads the model and measures every size), none the second.
(Tuning upward against an exhaustive sweep is in bench_tune.py.)

CPU only (what this machine has); the limit makes torch's allocator fail for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.events import EXIT_OOM, decode
from gpuwarden.core.oom.recovery import AttemptFacts, plan_recovery
from gpuwarden.core.rlimit import limited_argv
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate

LIMIT = int(1.6 * 2**30)
PINNED = {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
MAX_ATTEMPTS = 25


def _spec(batch: int, accum: int, *, steps: int = 1, limit: int | None = LIMIT) -> dict[str, Any]:
    return {
        "name": "bench-recovery",
        "kind": "train",
        "env": PINNED,
        "resources": {"gpus": 0, **({"memory_limit": limit} if limit else {})},
        "train": {
            "task": "image",
            "image": {"base_channels": 32, "num_blocks": 4, "patch_size": 128, "synthetic_samples": 512},
            "batch_size": batch,
            "grad_accum_steps": accum,
            "max_steps": steps,
            "log_interval": 1,
            "checkpoint_interval": 10**6,
        },
    }


def _attempt(work: Path, doc: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], float]:
    """One attempt as the daemon starts it; (ran, events, seconds)."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    spec_path = run_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec_path), "--run-dir", str(run_dir)]
    start = time.perf_counter()
    done = subprocess.run(
        limited_argv(argv, doc["resources"].get("memory_limit")),
        env={**os.environ, **PINNED},
        capture_output=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    events_file = run_dir / "attempts" / "1" / "events.jsonl"
    events = (
        [e for e in map(decode, events_file.read_text().splitlines()) if e] if events_file.exists() else []
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    if done.returncode not in (0, EXIT_OOM):
        raise RuntimeError(f"attempt failed unexpectedly (exit {done.returncode}): {done.stderr[-500:]!r}")
    return done.returncode == 0, events, wall


def _recover(
    work: Path, next_batch: Callable[[int, list[dict[str, Any]], RunSpec], int | None]
) -> dict[str, Any]:
    batch, effective = 128, 128
    wall, probes, first_s = 0.0, 0, 0.0
    for restarts in range(MAX_ATTEMPTS):
        doc = _spec(batch, max(1, effective // batch))
        ran, events, seconds = _attempt(work, doc)
        wall += seconds
        first_s = first_s or seconds
        if ran:
            kept = batch * max(1, effective // batch)
            return {
                "restarts": restarts,
                "wall_s": wall,
                "final_batch": batch,
                "probes": probes,
                "effective_batch": kept,
                # What the recovery cost beyond the attempt that ran, in start-ups of that attempt.
                "overhead": (wall - first_s - seconds) / seconds,
            }
        t0 = time.perf_counter()
        nxt = next_batch(batch, [{**e, "attempt": 1} for e in events], spec_from_mapping(doc))
        wall += time.perf_counter() - t0
        if isinstance(nxt, tuple):
            nxt, probes = nxt[0], probes + nxt[1]
        if nxt is None or nxt < 1:
            break
        batch = nxt
    return {"restarts": None, "wall_s": wall, "final_batch": None, "probes": probes, "effective_batch": None}


def _gpuwarden(
    work: Path, remembered: dict[int, int] | None = None
) -> Callable[[int, list[dict[str, Any]], RunSpec], Any]:
    """gpuwarden's retune; with `remembered`, the sizes measured so far are kept there (and
    used): a second run of the same shape."""

    def step(batch: int, events: list[dict[str, Any]], spec: RunSpec) -> Any:
        prober = SubprocessProber(
            spec,
            work / f"probes-{batch}",
            env={**os.environ, **PINNED},
            warmup_steps=1,
            measure_steps=1,
            session=True,
        )

        def probe(b: int) -> tuple[int | None, bool]:
            r = prober(Candidate(b, 1, "auto", False))
            return r.mem_peak, r.oom

        facts = AttemptFacts(number=1, events=events, exit_code=EXIT_OOM, host_capacity=LIMIT)
        known = sorted((remembered or {}).items())
        try:
            plan = plan_recovery(
                spec,
                facts,
                history=[],
                retunes_so_far=0,
                elapsed_s=0,
                probe=probe,
                remembered=known,
                probe_processes=lambda: prober.processes,
            )
        finally:
            prober.close()
        assert plan.spec is not None, plan.give_up
        if remembered is not None:
            remembered.update({p["batch_size"]: p["peak"] for p in plan.probes if p["peak"] and not p["oom"]})
        return plan.spec["train"]["batch_size"], prober.processes

    return step


def _largest_that_runs(work: Path) -> int | None:
    """The largest divisor of 128 below it whose attempt runs under the limit, largest first."""
    for batch in sorted((d for d in range(1, 128) if 128 % d == 0), reverse=True):
        if _attempt(work, _spec(batch, 128 // batch))[0]:
            return batch
    return None


def _round(work: Path) -> dict[str, dict[str, Any]]:
    """One recovery with every strategy; gpuwarden twice on the same shape."""
    memory: dict[int, int] = {}
    strategies: dict[str, Callable[[int, list[dict[str, Any]], RunSpec], Any]] = {
        "gpuwarden": _gpuwarden(work, memory),
        "gpuwarden, same shape again": _gpuwarden(work, memory),
        "halving": lambda b, e, s: b // 2,
        "x0.9 (accelerate)": lambda b, e, s: int(b * 0.9),
    }
    return {name: _recover(work, fn) for name, fn in strategies.items()}


def run() -> list[dict[str, Any]]:
    """`REPEATS` rounds, each recovering once with every strategy; medians of the rounds."""
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    try:
        largest = _largest_that_runs(work)
        rounds = [_round(work) for _ in range(REPEATS)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in rounds[0]:
        rows += _rows(name, [r[name] for r in rounds])
    chosen = [r["gpuwarden"]["final_batch"] or 0 for r in rounds]
    rows.append(
        figure_row(
            f"gpuwarden's micro-batch / the largest divisor of 128 that runs ({largest})",
            [100.0 * c / (largest or 1) for c in chosen],
            "%",
            target="≥ 90",
            check=lambda v: v >= 90,
        )
    )
    return rows


def _rows(name: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A strategy that never got a run going counts as MAX_ATTEMPTS restarts (and says so).
    restarts = [r["restarts"] if r["restarts"] is not None else MAX_ATTEMPTS for r in results]
    last = results[-1]
    detail = f"ran at {last['final_batch']}, effective batch {last['effective_batch']}"
    if any(r["restarts"] is None for r in results):
        detail += f"; {MAX_ATTEMPTS} = never ran"
    ours = name.startswith("gpuwarden")
    rows = [
        figure_row(
            f"recovery from micro-batch 128 (8x too large): {name} — restarts ({detail})",
            restarts,
            "restarts",
            target="≤ 2" if ours else "",
            check=(lambda v: v <= 2) if ours else None,
        ),
        figure_row(f"  {name}: wall time to a running fit", [r["wall_s"] for r in results], "s"),
    ]
    if ours:
        again = name.endswith("again")
        rows.append(
            figure_row(
                f"  {name}: probe processes",
                [r["probes"] for r in results],
                "processes",
                target="0" if again else "≤ 1",
                check=(lambda v: v == 0) if again else (lambda v: v <= 1),
            )
        )
        rows.append(
            figure_row(
                f"  {name}: cost beyond the attempt that ran, in start-ups of it",
                [r.get("overhead", 0.0) for r in results],
                "start-ups",
                target="≈ 1.1",
            )
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main_for(run))
