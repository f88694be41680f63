"""Writing the tuned spec: the user's file with the tuned knobs changed, and a header saying so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuwarden.core.command.config_file import load_config
from gpuwarden.core.config.resolve import rebased_paths
from gpuwarden.core.config.spec import load_spec


def write_tuned_spec(
    source: Path, out: Path, section: str, knobs: dict[str, Any], summary: str
) -> dict[str, str]:
    """Copy `source` with `section.<knob>` set for each tuned knob. The copy is the user's file
    round-tripped: comments, key order and quoting stay, only the tuned values differ — and, in
    another folder than the original, its relative paths, rewritten to start from there (what
    is returned: key → new path), so that it runs as the original would."""
    doc = load_config(source)
    for knob, value in knobs.items():
        doc.set(f"{section}.{knob}", value)
    moved = rebased_paths(load_spec(source), source.parent, out.parent)
    for key, path in moved.items():
        doc.set(key, path)
    block = doc.data.get(section)
    if "precision" in knobs and isinstance(block, dict):
        block.pop("amp", None)  # the legacy switch would contradict the tuned precision
    doc.data.pop("autotune", None)
    header = f"# tuned by `gpuwarden tune {source}` on {time.strftime('%Y-%m-%d %H:%M')}\n" + "".join(
        f"# {line}\n" for line in summary.splitlines()
    )
    out.write_text(header + doc.dump())
    return moved
