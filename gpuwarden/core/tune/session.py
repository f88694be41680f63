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
from gpuwarden.core.config.spec_tune import TuneSettings
from gpuwarden.core.errors import UserError
from gpuwarden.core.private import make_dirs
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.command_probe import CommandProber
from gpuwarden.core.tune.command_tune import command_knobs, command_start, setup_command_tune
from gpuwarden.core.tune.energy import EnergyCounter
from gpuwarden.core.tune.fingerprint import fingerprint, fingerprint_inputs
from gpuwarden.core.tune.objective import Objective, needs_energy, samples_per_kwh
from gpuwarden.core.tune.power import PowerLimiter, power_sweep, what_the_sweep_needs
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
        energy = ""
        if best.get("joules_per_sample"):
            kwh = samples_per_kwh(best["joules_per_sample"]) or 0
            energy = f", {best['joules_per_sample']:.4g} J/sample ({kwh:,.0f} samples/kWh)"
        objective = self.result.get("objective", "throughput")
        text = (
            f"micro-batch {c['batch_size']} × {c['grad_accum_steps']}, {c['precision']}"
            f"{', compile' if c['compile'] else ''}: {best['samples_per_s']:.2f} samples/s{energy}; "
            f"{len(self.result['trials'])} probes"
            f"{'' if objective == 'throughput' else f', objective {objective}'}; "
            f"stopped: {self.result['stopped_because']}"
        )
        noise = self.result.get("noise") or {}
        labels = (("repeat_spread", "repeated readings apart by"), ("step_spread", "steps within a probe"))
        known = [(what, noise[key]) for key, what in labels if isinstance(noise.get(key), int | float)]
        seen = [f"{what} {100 * value:.1f} %" for what, value in known]
        if seen:
            text += f"; noise seen: {', '.join(seen)}"
        settling = self.result.get("settling") or {}
        if settling.get("says"):
            text += "\n" + str(settling["says"])
        sweep = self.result.get("power_sweep") or {}
        if sweep.get("recommendation") or sweep.get("needs"):
            text += "\n" + str(sweep.get("recommendation") or sweep.get("needs"))
        return text


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


# Long: the signature and its docstring are half of it; the body is one session's steps in order
# (cache, probes, search, power sweep, remember), which read best together.
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
    objective: Objective | None = None,
    energy: EnergyCounter | None = None,
    sweep_power: bool | None = None,
    limiter: PowerLimiter | None = None,
) -> TuneOutcome:
    """The remembered result for this fingerprint, or a new search (then remembered).

    `on_probing` is called once when a search starts (not for a remembered result); `label`
    names the spec in errors (default: its name). `objective` and `sweep_power` default to the
    spec's `tune:` section; `energy` is the target GPU's energy counter (joules per sample for
    every probe), `limiter` what sets its power limit for the sweep.
    """
    name = label or spec.name
    if spec.command is not None:  # the user's own program: its roles, its probes
        spec, target = setup_command_tune(
            spec, target, change_effective_batch=change_effective_batch, label=name
        )
    # Every probe would fail the same way: say it once instead of after a ladder of probes.
    require_inputs(spec, name, "fix the path, then tune")
    settings = spec.tune or TuneSettings()
    objective = objective or settings.objective
    sweep = settings.power_sweep if sweep_power is None else sweep_power
    _check_energy(name, objective, target, energy, own_program=spec.command is not None)
    if sweep:
        _check_power(target, limiter)
    inputs = fingerprint_inputs(spec, target.device, objective, sweep)
    fp = fingerprint(inputs)
    cached = None if force else cache.get(fp)
    if cached is not None:
        return TuneOutcome(fp, True, dict(cached["knobs"]), dict(cached["result"]))
    start, per_device = start_candidate(spec)
    if on_probing is not None:
        on_probing()
    make_dirs(work_parent)  # `gpuwarden tune` may be the first to make the state folder
    work = Path(tempfile.mkdtemp(prefix=f"tune-{fp[:8]}-", dir=work_parent))
    try:
        prober: ProbeFn = (
            CommandProber(spec, work, env={**env, **target.env}, on_result=on_result)
            if spec.command is not None
            else SubprocessProber(
                spec, work, env=probe_env(spec, target, env), on_result=on_result, energy=energy
            )
        )
        search = Search(
            prober,
            capacity=target.capacity,
            headroom=headroom,
            min_gain=min_gain,
            max_trials=max_trials,
            objective=objective,
        )
        outcome = search.run(
            start,
            per_device_batch=None if change_effective_batch else per_device,
            max_batch=max_batch,
            precisions=target.precisions,
            compile_options=target.compile_options,
        )
        result = outcome.to_dict()
        gpu = target.gpu
        if outcome.best is not None and sweep and limiter is not None and gpu is not None:
            result["power_sweep"] = power_sweep(prober, outcome.best, limiter, gpu, objective, min_gain)
        elif needs_energy(objective):
            result["power_sweep"] = {"ran": False, "needs": what_the_sweep_needs(target.gpu, None)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if outcome.best is None:
        raise UserError(f"{spec.name}: no configuration ran: {outcome.stopped_because}")
    knobs = tuned_knobs(spec, outcome.best.candidate)
    cache.put(fp, inputs, result, knobs, uncertain=outcome.uncertain)
    return TuneOutcome(fp, False, knobs, result)


def probe_env(spec: RunSpec, target: Target, env: dict[str, str]) -> dict[str, str]:
    """A runner probe's environment, layered as the daemon starts an attempt: the run's `env`
    over the caller's (its thread count and allocator settings shape what a probe measures), the
    target's device selection over both."""
    return {**env, **spec.env, **target.env}


def _check_energy(
    name: str, objective: Objective, target: Target, energy: EnergyCounter | None, *, own_program: bool
) -> None:
    """An objective that needs joules per sample refuses before probing where there are none."""
    if not needs_energy(objective):
        return
    missing = target.energy_missing
    if own_program:
        # Probes of a user's program are timed from its own reports, not gpuwarden's runner,
        # so they carry no energy reading yet.
        missing = "probes of your own program measure throughput only"
    if missing is None and energy is None:
        missing = "its energy counter could not be opened"
    if missing is not None:
        raise UserError(
            f"{name}: the {objective} objective needs joules per sample, but {missing} — "
            "tune for throughput instead (--objective throughput)"
        )


def _check_power(target: Target, limiter: PowerLimiter | None) -> None:
    """The sweep refuses before probing when it could not change the limit anyway."""
    if target.gpu is None or limiter is None:
        raise UserError(what_the_sweep_needs(target.gpu, None))
    current = limiter.limit_w()
    denied = limiter.set_limit_w(current) if current is not None else "its power limit cannot be read"
    if denied is not None:
        raise UserError(what_the_sweep_needs(target.gpu, denied))
