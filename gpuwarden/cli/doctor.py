"""`gpuwarden doctor SPEC.yaml|RUN`: what slows a run down, with the evidence and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.format import note, print_json
from gpuwarden.cli.output_file import writing
from gpuwarden.core.config.resolve import moved_paths_note, rebased_paths
from gpuwarden.core.doctor.diagnose import (
    Diagnosis,
    diagnose_run,
    diagnose_spec_file,
    recheck,
)
from gpuwarden.core.doctor.finding import Finding, merged_fix
from gpuwarden.core.doctor.fix import apply_fixes, describe_fix, with_header
from gpuwarden.core.doctor.target import parse_gpu_memory
from gpuwarden.core.errors import UserError

SPEC_SUFFIXES = (".yaml", ".yml")


def _is_spec(target: str) -> bool:
    # A run's id or name never holds a "/": anything that does is a path (a FIFO, a device…)
    # and gets the file reader's one-line refusal rather than a run look-up.
    return target.endswith(SPEC_SUFFIXES) or "/" in target or Path(target).is_file()


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def format_evidence(evidence: dict[str, Any]) -> str:
    """`train.amp = false at spec.yaml:21; cores=2` — the key first, then the numbers."""
    parts: list[str] = []
    rest = dict(evidence)
    if "key" in rest:
        key, value = rest.pop("key"), rest.pop("value", None)
        where = rest.pop("where", None)
        default = rest.pop("default", False)
        place = f" at {where}" if where else (" (default)" if default else "")
        parts.append(f"{key} = {_value(value)}{place}")
    for name, value in rest.items():
        if value is None:
            continue
        parts.append(f"{name}={_value(value)}")
    return "; ".join(parts)


def format_fix(finding: Finding) -> str:
    if isinstance(finding.fix, dict):
        return "; ".join(describe_fix(finding.fix))
    return finding.fix


def render(diagnosis: Diagnosis) -> str:
    """The human output: one block per finding, errors first, with evidence and fix."""
    dev = diagnosis.device
    lines = [
        f"doctor: {diagnosis.target}",
        f"target: {dev.device.upper()} — {dev.source}; {dev.cores} core(s)",
    ]
    if not diagnosis.findings:
        lines.append("no findings")
    for f in diagnosis.findings:
        lines.append("")
        lines.append(f"{f.severity.upper():<8} {f.id}: {f.title}")
        lines.append(f"         evidence: {format_evidence(f.evidence)}")
        lines.append(f"         fix{' (--fix)' if f.fixable else ''}: {format_fix(f)}")
        if f.gain:
            lines.append(f"         gain: {f.gain}")
    for n in diagnosis.notes:
        lines.append(f"note: {n}")
    counts = {s: sum(1 for f in diagnosis.findings if f.severity == s) for s in ("error", "warning", "info")}
    fixable = sum(1 for f in diagnosis.findings if f.fixable)
    summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
    lines.append("")
    lines.append(f"{summary or 'nothing to report'}; {fixable} fixable automatically")
    return "\n".join(lines)


def write_fix(diagnosis: Diagnosis, out: Path, source_path: Path | None) -> dict[str, Any]:
    """Apply every automatic fix to the spec text, write `out`, and check the result again. A
    fixed spec written to another folder than the original's gets its relative paths rewritten
    to start from there, so that it runs as the original would."""
    if diagnosis.spec_text is None:
        raise UserError(f"{diagnosis.target}: no spec to fix (the run's stored spec did not validate)")
    fix = merged_fix(diagnosis.findings)
    fixed_ids = [f.id for f in diagnosis.findings if f.fixable]
    moved = _moved_paths(source_path, out)
    text = apply_fixes(diagnosis.spec_text, {**fix, **moved}, label=str(out))
    text = with_header(text, {**fix, **moved}, diagnosis.target, fixed_ids)
    remaining = recheck(text, str(out), diagnosis.device)
    with writing(out):
        out.write_text(text, encoding="utf-8")
    notes = [moved_paths_note(list(moved), out.parent)] if moved else []
    return {
        "path": str(out),
        "changes": {**fix, **moved},
        "fixed": fixed_ids,
        "remaining_fixable": [f.id for f in remaining if f.fixable],
        "notes": notes,
    }


def _moved_paths(source_path: Path | None, out: Path) -> dict[str, str]:
    """The relative paths of the spec at `source_path` as they must read from `out`'s folder."""
    if source_path is None:
        return {}
    from gpuwarden.core.config.spec import load_spec

    return rebased_paths(load_spec(source_path), source_path.parent, out.parent)


@click.command()
@click.argument("target")
@click.option(
    "--fix", "fix_path", type=click.Path(dir_okay=False, path_type=Path), help="write a corrected spec"
)
@click.option("--json", "as_json", is_flag=True, help='one JSON document: {"target", "findings", …}')
@click.option("--gpu-memory", help="judge for a GPU of this size (e.g. 24GiB) instead of this machine's")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="read runs from this database")
def doctor(
    target: str, fix_path: Path | None, as_json: bool, gpu_memory: str | None, db: Path | None
) -> None:
    """Check a run spec (SPEC.yaml) or a run (RUN: id or name) for what slows it down.

    Findings are not errors: the exit status is 0 unless the input itself is bad.
    """
    memory = parse_gpu_memory(gpu_memory) if gpu_memory else None
    source_path: Path | None = None
    if _is_spec(target):
        source_path = Path(target)
        diagnosis = diagnose_spec_file(source_path, memory)
    else:
        from gpuwarden.client.run_data import open_run_data

        data = open_run_data(db)
        try:
            diagnosis = diagnose_run(data, target, memory)
        finally:
            data.close()
    fixed: dict[str, Any] | None = None
    if fix_path is not None:
        fixed = write_fix(diagnosis, fix_path, source_path)
    if as_json:
        body = diagnosis.to_dict()
        if fixed is not None:
            body["fixed"] = fixed
        print_json(body)
        return
    click.echo(render(diagnosis))
    if fixed is not None:
        if fixed["changes"]:
            what = ", ".join(fixed["fixed"])
            note(f"wrote {fixed['path']}: {len(fixed['changes'])} change(s) for {what}")
        else:  # still written: `doctor --fix OUT && gpuwarden run OUT` holds either way
            note(f"wrote {fixed['path']}: the spec as it was, nothing needed fixing")
        if fixed["remaining_fixable"]:
            note(f"still fixable in it: {', '.join(fixed['remaining_fixable'])}")
        for n in fixed["notes"]:
            note(f"note: {n}")
