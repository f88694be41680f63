"""The script SDK's guard: a real allocation failure becomes checkpoint + oom event + exit 3;
anything else, and everything outside gpuwarden, passes through untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.sdk import EXIT_OOM, Reporter, oom_guard


def _allocate_too_much() -> None:
    bytearray(1 << 62)  # the allocator refuses for real: no machine has 4 EiB


def test_outside_gpuwarden_the_guard_changes_nothing() -> None:
    with pytest.raises(MemoryError), oom_guard(save=lambda: "never", reporter=Reporter(None)):
        _allocate_too_much()


def test_an_oom_saves_reports_and_exits_3(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    codes: list[int] = []
    with oom_guard(
        save=lambda: str(tmp_path / "ckpt"), batch_size=8, reporter=Reporter(str(events))
    ) as guard:
        guard._exit = codes.append
        guard.step, guard.samples_seen = 3, 48
        _allocate_too_much()
    assert codes == [EXIT_OOM]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["type"] for e in lines] == ["checkpoint", "oom"]
    assert (
        lines[0]["path"] == str(tmp_path / "ckpt") and lines[0]["step"] == 3 and lines[0]["reason"] == "oom"
    )
    assert lines[1]["verdict"] == "host_oom" and lines[1]["checkpoint"] == str(tmp_path / "ckpt")


def test_no_checkpoint_inside_the_optimizer_update_and_other_errors_pass(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    codes: list[int] = []
    guard = oom_guard(save=lambda: "x", reporter=Reporter(str(events)))
    guard._exit = codes.append
    with guard, guard.updating():
        _allocate_too_much()
    assert [json.loads(line)["type"] for line in events.read_text().splitlines()] == ["oom"]
    with pytest.raises(ValueError, match="not memory"), guard:
        raise ValueError("not memory")
    assert codes == [EXIT_OOM]
