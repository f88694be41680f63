"""`tune` against an exhaustive sweep, both with real probe processes of the training runner.

The sweep probes every micro-batch that keeps the effective batch (the 20 divisors of 240); the
search starts where a user would (micro-batch 4 × 60). Target: ≥ 95 % of the sweep's best
samples/s in ≤ 1/3 of its time. CPU here; the same code probes a GPU where there is one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate, Search, divisors

EFFECTIVE = 240
PINNED = {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}


def run() -> list[dict[str, Any]]:
    spec = spec_from_mapping(
        {
            "name": "bench-tune",
            "kind": "train",
            "env": PINNED,
            "resources": {"gpus": 0},
            "train": {
                "task": "image",
                "image": {"base_channels": 16, "num_blocks": 2, "patch_size": 32, "synthetic_samples": 4096},
                "batch_size": 4,
                "grad_accum_steps": EFFECTIVE // 4,
            },
        }
    )
    work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    env = {**os.environ, **PINNED}
    try:
        # Same probe for both: 1 warm-up step, then 3 measured optimizer steps.
        sweep_probe = SubprocessProber(spec, work / "sweep", env=env, warmup_steps=1, measure_steps=3)
        sweep = [sweep_probe(Candidate(b, EFFECTIVE // b, "auto", False)) for b in divisors(EFFECTIVE)]
        tune_probe = SubprocessProber(spec, work / "tune", env=env, warmup_steps=1, measure_steps=3)
        result = Search(tune_probe, capacity=None).run(
            Candidate(4, EFFECTIVE // 4, "auto", False), per_device_batch=EFFECTIVE
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best_sweep = max((r for r in sweep if r.ok and r.samples_per_s), key=lambda r: r.samples_per_s or 0)
    assert result.best is not None and result.best.samples_per_s and best_sweep.samples_per_s
    sweep_time = sum(r.wall_s for r in sweep)
    share = result.best.samples_per_s / best_sweep.samples_per_s
    time_share = result.wall_s / sweep_time
    chosen = f"{result.best.candidate.batch_size} vs {best_sweep.candidate.batch_size}"
    spent = f"{result.wall_s:.0f} s vs {sweep_time:.0f} s; {len(result.trials)} vs {len(sweep)} probes"
    return [
        {
            "benchmark": f"tune vs sweep (effective batch {EFFECTIVE}): best samples/s",
            "value": round(100 * share, 1),
            "unit": f"% of the sweep's best (micro-batch {chosen})",
            "target": "≥ 95",
            "ok": share >= 0.95,
        },
        {
            "benchmark": "tune vs sweep: time",
            "value": round(100 * time_share, 1),
            "unit": f"% of the sweep's time ({spent})",
            "target": "≤ 33",
            "ok": time_share <= 1 / 3,
        },
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
