"""One diagnosis: what is wrong, the numbers that show it, and the fix (automatic or in words)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}

# A fix is either spec changes, dotted key → new value (None removes the key), or a sentence for
# what cannot be done by editing the spec.
Fix = dict[str, Any] | str


@dataclass
class Finding:
    """A finding of doctor. `evidence` holds numbers, and `key`/`where` when about a spec key."""

    id: str
    severity: Severity
    title: str
    evidence: dict[str, Any]
    fix: Fix
    gain: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fixable(self) -> bool:
        """True when `--fix` can apply this finding by editing the spec."""
        return isinstance(self.fix, dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "fixable": self.fixable,
            "gain": self.gain,
        }


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


def merged_fix(findings: list[Finding]) -> dict[str, Any]:
    """Every automatic fix in one mapping (later findings win on the same key)."""
    out: dict[str, Any] = {}
    for f in findings:
        if isinstance(f.fix, dict):
            out.update(f.fix)
    return out
