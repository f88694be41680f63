"""A validated spec together with where each key was written, for findings that point at lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.yamlsource import KeyPath


def dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def split_dotted(key: str) -> tuple[str, ...]:
    return tuple(key.split("."))


@dataclass
class SpecView:
    """`spec` as validated; `lines` maps key paths the user wrote to their line in `label`."""

    spec: RunSpec
    label: str
    lines: dict[KeyPath, int] = field(default_factory=dict)
    # For specs without a file (a run's stored spec), every key counts as written.
    all_explicit: bool = False

    def explicit(self, path: KeyPath) -> bool:
        """Whether the user wrote this key (rather than getting the default)."""
        return self.all_explicit or path in self.lines

    def where(self, path: KeyPath) -> str:
        line = self.lines.get(path)
        # line 0 marks a key known to be set without a known line (a run's stored spec)
        return f"{self.label}:{line}" if line else self.label

    def evidence(self, path: KeyPath, value: Any, **extra: Any) -> dict[str, Any]:
        """Evidence about one spec key: the key, its value, where it is (or that it is the default)."""
        ev: dict[str, Any] = {"key": dotted(path), "value": value}
        if self.explicit(path):
            ev["where"] = self.where(path)
        else:
            ev["default"] = True
        ev.update(extra)
        return ev
