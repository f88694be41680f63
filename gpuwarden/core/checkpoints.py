"""Where a training run's checkpoints live, for whoever must find them without torch: the runner
writes and loads them (`gpuwarden.runners.checkpoint`), the daemon's probes resume from them.

`RUN_DIR/checkpoints/<step:08d>/` with `meta.json` written last; a folder with its final name and
a `meta.json` is complete (temporary ones are named `.tmp-…`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

META = "meta.json"
TMP_PREFIX = ".tmp-"


def checkpoint_name(step: int) -> str:
    return f"{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (by step)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.isdigit() and (p / META).is_file()]
    return sorted(found, key=lambda p: int(p.name))


def find_latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    """The optimizer step a checkpoint was taken at (its meta, else its folder name)."""
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
        return int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return int(path.name)


def link_checkpoint(source: Path, root: Path) -> Path:
    """`source` made available as a checkpoint under `root` without copying its bytes (hard links;
    a copy where links are impossible). The runner never writes into a finished checkpoint (it
    writes a new folder and renames it), so sharing the files cannot change the original."""
    target = root / source.name
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            try:
                os.link(item, target / item.name)
            except OSError:
                shutil.copy2(item, target / item.name)
    return target
