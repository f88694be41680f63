"""Reading what a run's log gained since the last look, as the bar watcher does."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.progress_bar import bar_readings
from gpuwarden.daemon.supervise.bar_watch import TAIL_BYTES, log_gained


def test_a_drawing_is_read_as_soon_as_it_is_whole_and_half_of_one_waits(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_bytes(b"loading\n\rtrain:  25%|##5       | 5/20 [00:01<00:03,  4.90it/s]")
    text, offset = log_gained(log, 0)
    assert text.endswith("5/20 [00:01<00:03,  4.90it/s]") and offset == log.stat().st_size
    with log.open("ab") as fh:
        fh.write(b"\rtrain:  30%|###       | 6/20 [00:01<00:0")  # the rest not written yet
    text, after = log_gained(log, offset)
    assert text.strip() == "" and after == offset + 1  # up to the half drawing, not into it
    with log.open("ab") as fh:
        fh.write(b"3,  4.90it/s]   ")  # tqdm pads a shorter drawing with spaces
    text, after = log_gained(log, after)
    assert text.startswith("train:  30%") and after == log.stat().st_size
    assert [r.n for r in bar_readings(text)] == [6]
    assert log_gained(log, after) == ("", after)


def test_a_log_cut_short_or_missing_reads_as_nothing(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    assert log_gained(log, 0) == ("", 0)
    log.write_bytes(b"done\n")
    assert log_gained(log, 1000) == ("", 5)


def test_only_the_last_bytes_of_a_flood_are_read_and_a_line_without_end_is_passed(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_bytes(b"x" * (3 * TAIL_BYTES))
    text, offset = log_gained(log, 0)
    assert len(text) == TAIL_BYTES and offset == 3 * TAIL_BYTES
