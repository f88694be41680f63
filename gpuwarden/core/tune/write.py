"""Writing the tuned spec: the user's file with the tuned knobs changed, and a header saying so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.yamlsource import load_yaml_file


def write_tuned_spec(source: Path, out: Path, section: str, knobs: dict[str, Any], summary: str) -> Path:
    """Copy `source` with `section.<knob>` set for each tuned knob (comments are not kept: the
    header names the source file)."""
    doc = load_yaml_file(source)
    data = dict(doc.data)
    block = dict(data.get(section) or {})
    block.update(knobs)
    if "precision" in knobs:
        block.pop("amp", None)  # the legacy switch would contradict the tuned precision
    data[section] = block
    data.pop("autotune", None)
    header = f"# tuned by `gpuwarden tune {source}` on {time.strftime('%Y-%m-%d %H:%M')}\n" + "".join(
        f"# {line}\n" for line in summary.splitlines()
    )
    out.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return out
