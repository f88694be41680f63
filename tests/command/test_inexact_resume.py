"""An attempt's log tells an inexact resume by the framework's own words, read from its head."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.command.resume import INEXACT_MESSAGE, LOG_HEAD_BYTES, inexact_resume

# What Lightning (loops/training_epoch_loop.py) writes through `warnings`, as it lands on stderr.
WARNING = (
    "/venv/lib/python3.11/site-packages/lightning/pytorch/loops/training_epoch_loop.py:224: "
    "You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not "
    "resumable. This can cause unreliable results if further training is done.\n"
)


def _log(tmp_path: Path, before: int, after: int = 0, name: str = "stderr.log") -> Path:
    path = tmp_path / name
    path.write_bytes(b"x" * before + WARNING.encode() + b"y" * after)
    return path


def test_the_warning_anywhere_in_the_head_is_found_even_across_a_read(tmp_path: Path) -> None:
    assert inexact_resume([_log(tmp_path, 0, 12_000_000)]) == INEXACT_MESSAGE  # a long run after it
    assert inexact_resume([_log(tmp_path, (1 << 20) - 40)]) == INEXACT_MESSAGE  # cut by the 1 MiB reads


def test_no_warning_past_the_head_nor_in_a_missing_or_clean_log(tmp_path: Path) -> None:
    assert inexact_resume([_log(tmp_path, LOG_HEAD_BYTES + 10)]) is None
    clean = tmp_path / "clean.log"
    clean.write_text("Restored all states from the checkpoint\n")
    assert inexact_resume([clean, tmp_path / "missing.log"]) is None
    assert inexact_resume([clean, _log(tmp_path, 10, name="rank0.log")]) == INEXACT_MESSAGE
