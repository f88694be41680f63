"""`autotune: true` and `profile: auto` for runs the daemon starts.

profile: applied at submit, where the spec still knows which keys the user wrote: only the
keys left unset take the detected GPU tier's starting values.
autotune: before a run's first attempt, on its own thread with the run's GPUs held: the result
remembered for the fingerprint, or a probe search (then remembered), written into the spec.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.oom.profile_command import command_profile
from gpuwarden.core.oom.profiles import profile_for
from gpuwarden.core.telemetry.nvml import open_gpu_reader
from gpuwarden.core.telemetry.types import GpuReader, GpuStatic
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.devices import tune_devices
from gpuwarden.core.tune.session import tune_spec, tuned_section
from gpuwarden.core.tune.target import pick_target
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.process import RUN_TAG, run_tag

log = logging.getLogger("gpuwarden.daemon.autotune")


def _unset_updates(
    model: BaseModel, values: dict[str, Any], prefix: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the section document with profile values for unset keys, {dotted key: new value})."""
    doc = model.model_dump(mode="json")
    applied: dict[str, Any] = {}
    for key, value in values.items():
        if key not in type(model).model_fields:
            continue
        current = getattr(model, key)
        if isinstance(value, dict) and isinstance(current, BaseModel):
            sub, sub_applied = _unset_updates(current, value, f"{prefix}.{key}")
            doc[key] = sub
            applied.update(sub_applied)
        elif key not in model.model_fields_set:
            doc[key] = value
            applied[f"{prefix}.{key}"] = value
    return doc, applied


def apply_profile(spec: RunSpec, gpus: list[GpuStatic]) -> tuple[dict[str, Any] | None, str]:
    """The spec document with the GPU tier's values for keys the user left unset, and a line
    saying what happened. None when nothing applies (no GPU, or nothing to change); a command
    run gets the tier's split of its own effective batch (`core.oom.profile_command`)."""
    section = spec.train if spec.train is not None else spec.infer
    if spec.profile != "auto" or (section is None and spec.command is None):
        return None, ""
    wanted = spec.resources.gpus
    candidates = [
        g for g in gpus if not isinstance(wanted, list) or str(g.index) in wanted or g.uuid in wanted
    ]
    memories = [g.memory_total for g in candidates if g.memory_total]
    if not memories or wanted == 0:
        return None, "profile: auto needs a GPU; none is here, so the spec's own values are used"
    memory = min(memories)
    if section is None:  # a command run: the tier's split of the program's own batch
        knobs, line = command_profile(spec, memory)
        if not knobs:
            return None, line
        document = spec.model_dump(mode="json")
        document["knobs"].update(knobs)
        return document, f"{line} (smallest candidate GPU: {memory / 2**30:.0f} GiB)"
    values = profile_for(memory, spec.kind, section.task)
    tier = values.pop("tier", "?")
    name = "train" if spec.train is not None else "infer"
    section_doc, applied = _unset_updates(section, values, name)
    doc = spec.model_dump(mode="json")
    doc[name] = section_doc
    if not applied:
        return None, f"profile {tier}: every value it sets is already in the spec"
    changes = ", ".join(f"{k}={v}" for k, v in applied.items())
    return doc, f"profile {tier} (smallest candidate GPU: {memory / 2**30:.0f} GiB): {changes}"


class Autotuner:
    """The supervisor's autotune hook: (spec, placed GPU UUIDs, run dir) → (spec document, line).

    The spec's `tune:` section chooses the objective (and the power-limit sweep); a reader of its
    own, open while probing, reads the GPU's energy counter (the sampler's reader belongs to the
    sampler thread)."""

    def __init__(
        self,
        gpu_statics: Callable[[], list[GpuStatic]],
        cache_dir: Path,
        *,
        power_limit_command: str | None = None,
        open_reader: Callable[[], GpuReader] = open_gpu_reader,
        environment_of: Callable[[str], Mapping[str, str] | None] = lambda run_id: None,
    ) -> None:
        self._gpu_statics = gpu_statics
        self._cache = TuneCache(cache_dir)
        self._power_limit_command = power_limit_command
        self._open_reader = open_reader
        self._environment_of = environment_of

    def __call__(self, spec: RunSpec, gpus: list[str], run_dir: Path) -> tuple[dict[str, Any], str]:
        placed = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": gpus or 0})})
        target = pick_target(placed, [g for g in self._gpu_statics() if g.uuid in gpus])
        # Probes start from the run's own environment, as its attempts will. Tagged like the run's
        # probes: a restarted daemon kills what a dead one left probing.
        run_id = run_dir.name
        env = {**run_environment.base(self._environment_of(run_id)), RUN_TAG: run_tag(run_id, None)}
        reader = self._open_reader()
        try:
            energy, limiter = tune_devices(reader, target, self._power_limit_command)
            outcome = tune_spec(
                spec, target, self._cache, run_dir / "autotune", env=env, energy=energy, limiter=limiter
            )
        finally:
            reader.close()
        doc = spec.model_dump(mode="json")
        section = tuned_section(spec)
        doc[section].update(outcome.knobs)
        if "precision" in outcome.knobs and section == "train":
            doc["train"]["amp"] = None
        doc["autotune"] = False  # tuned once; resumes and retunes start from here
        how = "remembered result" if outcome.cached else "probed"
        line = f"autotune ({how}, fingerprint {outcome.fingerprint}): {outcome.summary}"
        log.info("%s: %s", spec.name, line)
        return doc, line
