"""The config LightningCLI saved in an earlier attempt, moved aside before a restart.

LightningCLI writes the config it ran with to `config.yaml` in the trainer's log folder as
training starts, and refuses to start when that file exists ("SaveConfigCallback expected
out/config.yaml to NOT exist"). Where the log folder is the same from one start to the next — no
logger (the trainer's `default_root_dir`), W&B's default (the working folder) — every restart of
a run would be refused by the file its own first attempt wrote. A logger that numbers its folders
(`lightning_logs/version_N`) never meets it, and its folders are left alone.

So before attempt N of a Lightning run, a `config.yaml` in those folders that this run wrote (since
its first attempt was prepared) is moved into attempt N-1's folder, where `show` and the user find
it; it is never deleted, and a file the run did not write (the user's own config) is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwarden.core.command.record import attempt_dir
from gpuwarden.core.config.spec import RunSpec

SAVED_NAME = "config.yaml"  # SaveConfigCallback's default file name
KEPT_NAME = "lightning-saved-config.yaml"  # its name in the attempt folder it is moved to


def _log_folders(spec: RunSpec, values: Mapping[str, Any], cwd: Path) -> list[Path]:
    """The folders LightningCLI saves into when they do not change between starts: the working
    folder and the trainer's `default_root_dir` (the knob playing the output folder's role)."""
    assert spec.command is not None
    folders = [cwd]
    knob = spec.command.roles.knob_names().get("output_dir")
    value = values.get(knob) if knob is not None else None
    if value not in (None, ""):
        folders.append(cwd / str(value))
    unique: list[Path] = []
    for folder in folders:
        if folder.resolve() not in [f.resolve() for f in unique]:
            unique.append(folder)
    return unique


def _the_users(spec: RunSpec, argv: list[str], cwd: Path) -> set[Path]:
    """Files the user handed the program: never moved, whatever their time."""
    assert spec.command is not None
    given = {(cwd / arg).resolve() for arg in argv if arg.endswith((".yaml", ".yml"))}
    if spec.command.config_file is not None:
        given.add(Path(spec.command.config_file).resolve())
    return given


def set_aside(
    spec: RunSpec,
    values: Mapping[str, Any],
    argv: list[str],
    cwd: Path,
    run_dir: Path,
    attempt: int,
    since: float,
) -> list[tuple[Path, Path]]:
    """Move the configs an earlier attempt of this Lightning run saved where the next one saves
    its own; (from, to) of each moved."""
    assert spec.command is not None
    if spec.command.framework != "lightning" or attempt <= 1:
        return []
    users = _the_users(spec, argv, cwd)
    moved: list[tuple[Path, Path]] = []
    for folder in _log_folders(spec, values, cwd):
        saved = folder / SAVED_NAME
        try:
            written = saved.stat().st_mtime if saved.is_file() and not saved.is_symlink() else None
        except OSError:
            continue
        if written is None or written < since or saved.resolve() in users:
            continue
        kept = attempt_dir(run_dir, attempt - 1) / (KEPT_NAME if not moved else f"{len(moved)}-{KEPT_NAME}")
        try:
            os.replace(saved, kept)
        except OSError:
            continue  # another file system: the program says so itself when it starts
        moved.append((saved, kept))
    return moved


def set_aside_note(moved: list[tuple[Path, Path]], attempt: int) -> str:
    """One line for the attempt's events, or "" when nothing was moved."""
    if not moved:
        return ""
    paths = ", ".join(f"{src} → {dst}" for src, dst in moved)
    return (
        f"the config LightningCLI saved in attempt {attempt - 1} moved aside so attempt {attempt} "
        f"can save its own ({paths})"
    )
