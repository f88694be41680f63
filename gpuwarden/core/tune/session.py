"""One tuning session for a spec on a target: the cache, the probes, the search, the knobs.

Shared by `gpuwarden tune` and the daemon's `autotune: true`, so both remember and reuse the
same results under the same fingerprint.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.config.inputs import require_inputs
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.command_probe import CommandProber
from gpuwarden.core.tune.command_tune import command_knobs, command_start, setup_command_tune
from gpuwarden.core.tune.fingerprint import fingerprint, fingerprint_inputs
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate, ProbeFn, ProbeResult, Search
from gpuwarden.core.tune.target import Target


@dataclass
class TuneOutcome:
    fingerprint: str
    cached: bool
    knobs: dict[str, Any]  # the spec section's keys to set
    result: dict[str, Any]  # TuneResult.to_dict(), or the remembered one

    @property
    def summary(self) -> str:
        best = self.result["best"]
        c = best["candidate"]
        return (
            f"micro-batch {c['batch_size']} × {c['grad_accum_steps']}, {c['precision']}"
            f"{', compile' if c['compile'] else ''}: {best['samples_per_s']:.2f} samples/s; "
            f"{len(self.result['trials'])} probes; stopped: {self.result['stopped_because']}"
        )


def start_candidate(spec: RunSpec) -> tuple[Candidate, int | None]:
    """The spec's own configuration, and the per-device batch to keep (None for inference)."""
    if spec.train is not None:
        t = spec.train
        return Candidate(t.batch_size, t.grad_accum_steps, t.resolved_precision_request(), t.compile), (
            t.batch_size * t.grad_accum_steps
        )
    if spec.infer is not None:
        i = spec.infer
        return Candidate(i.batch_size, 1, i.precision, i.compile), None
    if spec.command is not None:
        return command_start(spec)
    raise UserError(f"{spec.name}: only train and infer runs can be tuned — a command run has no known batch")


def tuned_section(spec: RunSpec) -> str:
    """The spec key whose values a tune sets: `train`, `infer`, or a command run's `knobs`."""
    return "train" if spec.train is not None else "infer" if spec.infer is not None else "knobs"


def tuned_knobs(spec: RunSpec, c: Candidate) -> dict[str, Any]:
    """The section keys a tuned candidate sets; the learning rate follows a changed effective
    batch (linear scaling rule)."""
    if spec.command is not None:
        return command_knobs(spec, c)
    if spec.train is None:
        return {"batch_size": c.batch_size, "precision": c.precision, "compile": c.compile}
    t = spec.train
    knobs: dict[str, Any] = {
        "batch_size": c.batch_size,
        "grad_accum_steps": c.grad_accum_steps,
        "precision": c.precision,
        "compile": c.compile,
    }
    new_effective = c.batch_size * c.grad_accum_steps * t.world_size
    if new_effective != t.effective_batch:
        optimizer = t.optimizer.model_dump(mode="json")
        optimizer["lr"] = t.optimizer.lr * new_effective / t.effective_batch
        knobs["optimizer"] = optimizer
    return knobs


def tune_spec(
    spec: RunSpec,
    target: Target,
    cache: TuneCache,
    work_parent: Path,
    *,
    env: dict[str, str],
    force: bool = False,
    max_trials: int = 12,
    headroom: float = 0.08,
    min_gain: float = 0.05,
    change_effective_batch: bool = False,
    max_batch: int = 1024,
    on_result: Callable[[int, ProbeResult], None] | None = None,
    on_probing: Callable[[], None] | None = None,
    label: str | None = None,
) -> TuneOutcome:
    """The remembered result for this fingerprint, or a new search (then remembered).

    `on_probing` is called once when a search starts (not for a remembered result); `label`
    names the spec in errors (default: its name).
    """
    if spec.command is not None:  # the user's own program: its roles, its probes
        spec, target = setup_command_tune(
            spec, target, change_effective_batch=change_effective_batch, label=label or spec.name
        )
    # Every probe would fail the same way: say it once instead of after a ladder of probes.
    require_inputs(spec, label or spec.name, "fix the path, then tune")
    inputs = fingerprint_inputs(spec, target.device)
    fp = fingerprint(inputs)
    cached = None if force else cache.get(fp)
    if cached is not None:
        return TuneOutcome(fp, True, dict(cached["knobs"]), dict(cached["result"]))
    start, per_device = start_candidate(spec)
    if on_probing is not None:
        on_probing()
    work_parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"tune-{fp[:8]}-", dir=work_parent))
    try:
        prober: ProbeFn = (
            CommandProber(spec, work, env={**env, **target.env}, on_result=on_result)
            if spec.command is not None
            else SubprocessProber(spec, work, env={**env, **target.env}, on_result=on_result)
        )
        search = Search(
            prober, capacity=target.capacity, headroom=headroom, min_gain=min_gain, max_trials=max_trials
        )
        outcome = search.run(
            start,
            per_device_batch=None if change_effective_batch else per_device,
            max_batch=max_batch,
            precisions=target.precisions,
            compile_options=target.compile_options,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if outcome.best is None:
        raise UserError(f"{spec.name}: no configuration ran: {outcome.stopped_because}")
    knobs = tuned_knobs(spec, outcome.best.candidate)
    result = outcome.to_dict()
    cache.put(fp, inputs, result, knobs)
    return TuneOutcome(fp, False, knobs, result)
