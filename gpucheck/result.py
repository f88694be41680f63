"""What a step hands back: its status, one line, and rows of checks or figures.

A step process writes its `StepResult` as JSON to the file named by `$GPUCHECK_RESULT`; the
runner reads it back. Rows are plain dicts: figures from `bench.figures.figure_row` (median and
range of repetitions, target, ok) or checks (`check_row`: what was compared with what, the
tolerance, ok).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped", "error", "timeout"]
RESULT_ENV = "GPUCHECK_RESULT"


@dataclass
class StepResult:
    name: str
    status: Status
    summary: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None
    log: str | None = None
    code: str | None = None  # the code it ran on (`window.code_fingerprint`)

    @classmethod
    def from_rows(
        cls, name: str, rows: list[dict[str, Any]], summary: str, notes: list[str] | None = None
    ) -> StepResult:
        """Passed unless a row with a target missed it (`ok` False)."""
        missed = [r for r in rows if r.get("ok") is False]
        status: Status = "failed" if missed else "passed"
        if missed:
            summary += f"; missed: {', '.join(str(r.get('benchmark') or r.get('check')) for r in missed)}"
        return cls(name, status, summary, rows, notes or [])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        return cls(**data)


def check_row(check: str, ours: Any, reference: Any, tolerance: str, ok: bool | None) -> dict[str, Any]:
    """One comparison: our value, what it was compared with, within what, and the verdict."""
    return {"check": check, "ours": ours, "reference": reference, "tolerance": tolerance, "ok": ok}


def write_result(result: StepResult, path: Path | None = None) -> Path | None:
    """Write to `path` (default `$GPUCHECK_RESULT`); nothing when neither is given."""
    target = path or (Path(os.environ[RESULT_ENV]) if os.environ.get(RESULT_ENV) else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return target


def read_result(path: Path) -> StepResult | None:
    try:
        return StepResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
