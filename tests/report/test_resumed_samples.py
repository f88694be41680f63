"""Samples and loss of a user's script (a `kind: command` run) stopped and resumed: its events
as the daemon stores them — the SDK's `progress` and `checkpoint`, the daemon's `prepared` —
with no runner `started` event to say where an attempt resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cli.report_format import render_comparison, render_text
from gpuwarden.core.report.compare import compare_reports
from gpuwarden.core.report.db_data import DbRunData
from gpuwarden.core.report.performance import build_report
from gpuwarden.core.report.snapshot import collect_run
from tests.report.builders import T0, Recorder

SPEC = {"version": 1, "name": "script", "kind": "command", "command": {"argv": ["python", "train.py"]}}
CKPT = "/runs/script/outputs/checkpoint-{}"


def _progress(start: float, counts: range) -> list[dict[str, Any]]:
    """What `sdk.progress(step, samples, loss=…, batch_size=10)` writes, one step a second."""
    return [
        {
            "v": 1,
            "type": "progress",
            "ts": start + i + 1,
            "step": n // 10,
            "samples_seen": n,
            "loss": 10.0 / n,
            "batch_size": 10,
            "vm_peak": 1 << 30,
        }
        for i, n in enumerate(counts)
    ]


def _checkpoint(ts: float, samples: int) -> dict[str, Any]:
    """What `sdk.checkpoint(path, step, samples)` writes."""
    path = CKPT.format(samples // 10)
    return {
        "v": 1,
        "type": "checkpoint",
        "ts": ts,
        "path": path,
        "step": samples // 10,
        "samples_seen": samples,
    }


def _record(
    tmp_path: Path, events: list[list[dict[str, Any]]], resumed_from: dict[int, str | None]
) -> dict[str, Any]:
    """A run of one 100 s attempt per list in `events`; `resumed_from` gives the checkpoint the
    daemon handed each attempt in its `prepared` event (absent: the event without it). Returns
    the report, after checking the store's figures (the run detail's) agree with it."""
    rec = Recorder(tmp_path / "g.db")
    windows: list[tuple[float, float, list[str], int]] = [
        (T0 + 200 * n, T0 + 200 * n + 100, [], 10 + n) for n in range(len(events))
    ]
    rec.run("script", SPEC, windows, dict(enumerate(events, start=1)), kind="command")
    for attempt, path in resumed_from.items():
        rec.runs.add_daemon_event("script", attempt, "prepared", {"message": "…", "resume_from": path})
    data = DbRunData(tmp_path / "g.db")
    try:
        report = build_report(collect_run(data, "script"))
    finally:
        data.close()
    per_attempt = [a["samples"] for a in report["energy"]["per_attempt"]]
    assert rec.runs.samples_done("script") == dict(enumerate(per_attempt, start=1))
    return report


def _samples(report: dict[str, Any]) -> list[int]:
    assert report["throughput"]["samples"] == sum(a["samples"] for a in report["energy"]["per_attempt"])
    return [a["samples"] for a in report["energy"]["per_attempt"]]


def test_an_attempt_counts_from_the_checkpoint_the_daemon_resumed_it_from(tmp_path: Path) -> None:
    # Attempt 1 got to 60 but saved at 50; attempt 2 redoes 50 → 60 and goes on to 100.
    first = [*_progress(T0, range(10, 61, 10)), _checkpoint(T0 + 5.5, 50)]
    second = _progress(T0 + 200, range(60, 101, 10))
    report = _record(tmp_path, [first, second], {2: CKPT.format(5)})
    assert _samples(report) == [60, 50]
    assert report["throughput"]["samples_per_s_wall"] == pytest.approx(110 / 200)


def test_an_attempt_the_daemon_started_afresh_counts_from_zero(tmp_path: Path) -> None:
    # Attempt 1 died before its first checkpoint, so attempt 2 started from scratch, saved at
    # 50 and stopped; attempt 3 resumed there.
    first = _progress(T0, range(10, 31, 10))
    second = [*_progress(T0 + 200, range(10, 61, 10)), _checkpoint(T0 + 205.5, 50)]
    third = _progress(T0 + 400, range(60, 101, 10))
    report = _record(tmp_path, [first, second, third], {2: None, 3: CKPT.format(5)})
    assert _samples(report) == [30, 60, 50]


def test_without_a_recorded_resume_point_an_attempt_that_counts_on_starts_where_the_last_stopped(
    tmp_path: Path,
) -> None:
    # A run recorded before the daemon noted resume points in `prepared`.
    first = [*_progress(T0, range(10, 51, 10)), _checkpoint(T0 + 5.5, 50)]
    second = _progress(T0 + 200, range(60, 101, 10))
    assert _samples(_record(tmp_path, [first, second], {})) == [50, 50]


def test_without_a_recorded_resume_point_a_lower_first_count_is_counted_from_itself(
    tmp_path: Path,
) -> None:
    # Attempt 2 resumed from the checkpoint at 30 (or started afresh: the record cannot tell),
    # so only what it did from its first report, 40 → 100, is sure to be its own; never more.
    first = [*_progress(T0, range(10, 51, 10)), _checkpoint(T0 + 3.5, 30)]
    second = _progress(T0 + 200, range(40, 101, 10))
    assert _samples(_record(tmp_path, [first, second], {})) == [50, 60]


def test_the_loss_of_a_script_is_its_first_and_last_progress_loss(tmp_path: Path) -> None:
    first = [*_progress(T0, range(10, 51, 10)), _checkpoint(T0 + 5.5, 50)]
    second = _progress(T0 + 200, range(60, 101, 10))
    report = _record(tmp_path, [first, second], {2: CKPT.format(5)})
    assert report["loss"] == {"first": 1.0, "last": 0.1}


def test_a_loop_rate_that_leaves_out_an_attempt_says_so_and_compare_shows_the_wall_rate(
    tmp_path: Path,
) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    # A: 100 samples at 10/s in one attempt. B: the same loop, but its second attempt reported
    # progress once, so B's loop rate is its first attempt's.
    a = _record(tmp_path / "a", [_progress(T0, range(10, 101, 10))], {})
    first = [*_progress(T0, range(10, 51, 10)), _checkpoint(T0 + 5.5, 50)]
    b = _record(tmp_path / "b", [first, _progress(T0 + 200, range(100, 101, 10))], {2: CKPT.format(5)})
    note = "the loop rate is attempt 1's only: attempt 2 reported progress once"
    assert a["throughput"]["loop_note"] is None and b["throughput"]["loop_note"] == note
    assert "10.00 (loop); 0.50 over wall time (" + note + ")" in render_text(b)
    result = compare_reports(a, b)
    rows = {row["metric"]: row for row in result["rows"]}
    assert rows["samples_per_s"]["ratio"] == pytest.approx(1.0)
    assert rows["samples_per_s_wall"]["ratio"] == pytest.approx(0.5)
    assert result["notes"] == ["B: " + note]
    assert render_comparison(result).splitlines()[-1] == "note B: " + note
