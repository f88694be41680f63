"""`gpuwarden example-models DIR` where DIR cannot be written: one line, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import preloaded


@pytest.mark.parametrize("where", ["a-file/models", "/proc/gpuwarden-example-models"])
def test_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    done = preloaded.run(
        [sys.executable, "-m", "gpuwarden", "example-models", where], cwd=tmp_path, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]  # after the note saying where it builds
    assert line.startswith("gpuwarden: cannot write the example models in ") and where in line
    assert line.endswith("choose a folder you can write")
