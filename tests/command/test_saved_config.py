"""Before a Lightning run's restart, the config LightningCLI saved in an earlier attempt is moved
into that attempt's folder — only a file this run wrote, only where the next start saves again."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping

CONFIG = "trainer:\n  logger: false\n  default_root_dir: out\ndata:\n  batch_size: 64\n"


def _spec(project: Path, framework: str = "lightning") -> RunSpec:
    (project / "config.yaml").write_text(CONFIG)
    document: dict[str, Any] = {
        "name": "cli",
        "kind": "command",
        "command": {
            "argv": ["python", "main.py", "fit", "--config", "config.yaml"],
            "config_file": str(project / "config.yaml"),
            "cwd": str(project),
            "framework": framework,
        },
    }
    return complete_command(spec_from_mapping(document))


def _saved(path: Path, text: str = "data:\n  batch_size: 64\n", age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_the_config_attempt_one_saved_moves_into_its_folder_before_attempt_two(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path), tmp_path / "run"
    first = prepare_attempt(spec, "r1", run_dir, 1)
    assert "moved aside" not in first.note
    saved = _saved(tmp_path / "out" / "config.yaml")  # LightningCLI's, as attempt 1 starts training
    second = prepare_attempt(spec, "r1", run_dir, 2)
    kept = run_dir / "attempts" / "1" / "lightning-saved-config.yaml"
    assert not saved.exists() and kept.read_text() == "data:\n  batch_size: 64\n"
    assert (
        f"the config LightningCLI saved in attempt 1 moved aside so attempt 2 can save its own ({saved} → {kept})"
        in second.note
    )
    assert second.record.resume_note is not None and str(kept) in second.record.resume_note


def test_a_config_saved_in_the_working_folder_moves_too_and_the_users_own_never(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path), tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    (tmp_path / "config.yaml").touch()  # the user's file, touched since: still theirs
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert (tmp_path / "config.yaml").read_text() == CONFIG
    assert "moved aside" not in second.note


def test_what_the_run_did_not_write_and_numbered_log_folders_stay(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path), tmp_path / "run"
    older = _saved(tmp_path / "out" / "config.yaml", age_s=3600)  # an earlier run's
    prepare_attempt(spec, "r1", run_dir, 1)
    numbered = _saved(tmp_path / "out" / "lightning_logs" / "version_0" / "config.yaml")
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert older.exists() and numbered.exists()  # the next start saves in version_1
    assert "moved aside" not in second.note


def test_only_a_lightning_run_has_its_config_moved(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path, framework="none"), tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    saved = _saved(tmp_path / "config.yaml.d" / "config.yaml")
    _saved(tmp_path / "out" / "config.yaml")
    prepare_attempt(spec, "r1", run_dir, 2)
    assert saved.exists() and (tmp_path / "out" / "config.yaml").exists()
