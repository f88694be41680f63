"""The files a tune's probes wrote beside the program are named: overwritten apart from new."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.core.tune.written_outside import FolderFiles


def test_written_files_are_named_overwritten_apart_from_new_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "final.pt").write_text("a trained model")
    (tmp_path / "train.py").write_text("print()")
    (tmp_path / "out").mkdir()
    before = FolderFiles.read(tmp_path)
    assert before.written_note() is None  # nothing written yet
    (tmp_path / "final.pt").write_text("a probe's model")
    os.utime(tmp_path / "final.pt", ns=(1, 1))  # written, whatever the clock's resolution
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "out" / "ckpt.pt").write_text("inside a folder: not read")
    note = before.written_note()
    assert note == (
        f"the probes wrote in {tmp_path}, outside the output folder each was given: overwrote final.pt "
        "and left results.json — have the program write its files under its output folder (the "
        "output_dir role), and check any that an earlier run left there"
    )


def test_a_folder_that_cannot_be_read_says_nothing(tmp_path: Path) -> None:
    assert FolderFiles.read(tmp_path / "missing").written_note() is None
