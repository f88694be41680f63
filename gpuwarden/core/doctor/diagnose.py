"""Doctor's two entry points: a spec file, or a run (its stored spec plus its telemetry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.config.inputs import example_models_fix, missing_inputs
from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import RunSpec, spec_from_document, spec_from_mapping
from gpuwarden.core.config.yamlsource import KeyPath, key_path, load_yaml_file
from gpuwarden.core.doctor.finding import Finding, sort_findings
from gpuwarden.core.doctor.run_checks import check_run
from gpuwarden.core.doctor.spec_checks import check_spec
from gpuwarden.core.doctor.spec_view import SpecView
from gpuwarden.core.doctor.target import Target, detect_target, gpu_target, usable_cores
from gpuwarden.core.errors import UserError
from gpuwarden.core.report.data import RunData
from gpuwarden.core.report.snapshot import RunSnapshot, collect_run
from gpuwarden.core.telemetry.types import GpuReader


@dataclass
class Diagnosis:
    """What doctor found about one target, and the YAML text `--fix` edits."""

    target: str
    device: Target
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    spec_text: str | None = None  # the YAML to edit (the file, or the run's spec rendered)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "device": self.device.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes,
        }


def _wants_gpu(spec: RunSpec) -> bool:
    return spec.resources.gpus != 0


def diagnose_spec_file(
    path: Path, gpu_memory: int | None = None, reader_factory: Callable[[], GpuReader] | None = None
) -> Diagnosis:
    """Static checks of a spec file. A file that does not validate raises ConfigError/UserError."""
    doc = load_yaml_file(path)
    spec = spec_from_document(doc)
    with doc.locating(RunSpec.model_fields):  # a policy file beside the spec is read here
        resolved = resolve_relative_paths(spec, path.resolve().parent)
        # A command run's own config file is read as a submit reads it: what `run` would refuse
        # (a missing or hostile file, a bound key it lacks) doctor refuses with the same line.
        complete_command(resolved)
    target = detect_target(gpu_memory, _wants_gpu(spec), reader_factory)
    view = SpecView(spec=spec, label=doc.label, lines=doc.lines)
    findings, notes = check_spec(view, target)
    findings += input_findings(view, resolved)
    return Diagnosis(str(path), target, sort_findings(findings), notes, path.read_text(encoding="utf-8"))


def input_findings(view: SpecView, resolved: RunSpec) -> list[Finding]:
    """An error per input the spec names that is not there: `gpuwarden run` would refuse it."""
    findings = []
    fix = example_models_fix(resolved) or "fix the path (relative paths start from the spec's directory)"
    for problem in missing_inputs(resolved):
        path = key_path(problem.split(":", 1)[0])  # `command.argv[3]` → ("command", "argv", 3)
        value: Any = view.spec  # as written (relative), not as resolved
        for part in path:
            value = value[part] if isinstance(part, int) else getattr(value, part, None)
        findings.append(
            Finding(
                "missing-input",
                "error",
                problem,
                view.evidence(path, None if value is None else str(value)),
                fix,
            )
        )
    return findings


def run_target(snap: RunSnapshot, gpu_memory: int | None) -> Target:
    """The device the run used (its first GPU), or `--gpu-memory`'s, or the CPU."""
    cores = usable_cores()
    if gpu_memory is not None:
        return Target(
            device="gpu",
            source=f"--gpu-memory {gpu_memory / (1 << 30):g} GiB",
            cores=cores,
            memory_total=gpu_memory,
        )
    uuids = [u for a in snap.attempts for u in a.gpus]
    if not uuids:
        return Target(device="cpu", source="the run used the CPU", cores=cores)
    info = snap.gpu_info.get(uuids[0], {})
    name = info.get("name")
    return gpu_target(
        info.get("memory_total"),
        name,
        info.get("compute_capability"),
        f"the run's GPU: {name or uuids[0]}",
        cores,
    )


def diagnose_run(
    data: RunData, ref: str, gpu_memory: int | None = None, now: float | None = None
) -> Diagnosis:
    """Telemetry checks of a run plus static checks of the spec it was submitted with."""
    snap = collect_run(data, ref, now)
    run = snap.run
    label = f"run {run.get('name')} ({run.get('id')})"
    target = run_target(snap, gpu_memory)
    findings, notes = check_run(snap)
    spec_doc = run.get("submitted_spec") or run.get("spec")
    text: str | None = None
    if isinstance(spec_doc, dict):
        try:
            spec = spec_from_mapping(spec_doc, label=f"{label} spec")
        except UserError as exc:
            notes.append(
                f"spec checks: skipped — the stored spec no longer validates ({exc.message.splitlines()[0]})"
            )
        else:
            # stored specs hold every default, so nothing tells what the user wrote: what differs
            # from the defaults counts as written
            written: dict[KeyPath, int] = {path: 0 for path in _non_default_paths(spec_doc)}
            view = SpecView(spec=spec, label=f"{label} spec", lines=written)
            spec_findings, spec_notes = check_spec(view, target)
            findings += spec_findings
            notes += spec_notes
            text = yaml.safe_dump(spec_doc, sort_keys=False, allow_unicode=True)
    return Diagnosis(label, target, sort_findings(findings), notes, text)


def _non_default_paths(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """Key paths whose value differs from what a spec with only the required keys would get."""
    defaults = spec_from_mapping(_required_only(doc)).model_dump(mode="json")
    out: list[tuple[str, ...]] = []

    def walk(a: Any, b: Any, path: tuple[str, ...]) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key, value in a.items():
                walk(value, b.get(key), (*path, str(key)))
        elif a != b:
            out.append(path)

    walk(doc, defaults, ())
    return out


def _required_only(doc: dict[str, Any]) -> dict[str, Any]:
    """The minimal spec of the same kind and task (required keys only)."""
    kind = doc.get("kind")
    base: dict[str, Any] = {"name": doc.get("name", "x"), "kind": kind}
    section = doc.get(kind) if isinstance(kind, str) else None
    if isinstance(section, dict):
        required = ("task", "model", "data", "input", "argv")
        base[str(kind)] = {k: section[k] for k in required if section.get(k) is not None}
    return base


def recheck(text: str, label: str, target: Target) -> list[Finding]:
    """Static findings for YAML text (a `--fix` result) on the same target as the original."""
    from gpuwarden.core.config.yamlsource import parse_yaml

    doc = parse_yaml(text, label)
    view = SpecView(spec=spec_from_document(doc), label=label, lines=doc.lines)
    findings, _ = check_spec(view, target)
    return sort_findings(findings)
