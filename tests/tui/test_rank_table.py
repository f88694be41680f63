"""The run detail's rank table: one line per rank of a multi-process attempt, the straggler and a
rank's own failure marked, hidden for a one-process run."""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult

from gpuwarden.core.api import Attempt, RankStatus
from gpuwarden.tui.widgets.rank_table import RankTable, ranks_text
from tests.tui.conftest import run

GIB = 1 << 30


def rank(n: int, **extra: Any) -> RankStatus:
    fields: dict[str, Any] = {
        "rank": n, "pid": 900 + n, "gpu": f"GPU-{n}", "device": f"cuda:{n}", "step": 12, "samples_seen": 384,
        "progress_at": 1.0, "mem_allocated": None, "mem_reserved": None, "mem_peak": (10 + n) * GIB,
        "vm_peak": None, "last_event": "progress", "failure": None, "straggler": False, "straggler_reason": None,
    }  # fmt: skip
    return RankStatus.model_validate({**fields, **extra})


def attempt(ranks: list[RankStatus]) -> Attempt:
    return Attempt.model_validate(
        {
            "run_id": "r1", "attempt": 1, "state": "running", "pid": 900, "create_time": 1.0, "started_at": 1.0,
            "ended_at": None, "exit_code": None, "signal": None, "classification": None, "reason": None,
            "adopted": False, "events_offset": 0, "events_skipped": 0, "stdout_path": "o", "stderr_path": "e",
            "events_path": "v", "gpus": [r.gpu for r in ranks if r.gpu], "oom_kill_before": None,
            "world_size": max(1, len(ranks)), "ranks": ranks,
        }
    )  # fmt: skip


def test_each_rank_is_a_line_with_its_gpu_step_and_memory_and_the_straggler_marked() -> None:
    behind = rank(1, step=11, straggler=True, straggler_reason="at step 11, others at up to 12")
    text = ranks_text([rank(0), behind], {"GPU-0": 0, "GPU-1": 3}).plain
    lines = text.splitlines()
    assert lines[0] == "Ranks (2)"
    assert "GPU 0" in lines[1] and "pid 900" in lines[1] and "12" in lines[1] and "10 GiB peak" in lines[1]
    assert "straggler" not in lines[1]
    assert "GPU 3" in lines[2] and "11 GiB peak" in lines[2]
    assert lines[2].endswith("straggler: at step 11, others at up to 12")


def test_a_cpu_rank_shows_its_address_space_and_a_failure_stands_out() -> None:
    text = ranks_text([rank(0, gpu=None, vm_peak=GIB), rank(1, gpu=None, failure="oom: host_oom")], {}).plain
    first, second = text.splitlines()[1:]
    assert "CPU" in first and "1.0 GiB addr" in first
    assert second.endswith("oom: host_oom")


class _Host(App[None]):
    def compose(self) -> ComposeResult:
        yield RankTable()


def test_the_table_shows_only_for_a_gang() -> None:
    async def body() -> None:
        app = _Host()
        async with app.run_test() as pilot:
            table = app.query_one(RankTable)
            table.show(attempt([]), {})
            await pilot.pause()
            assert not table.display
            table.show(attempt([rank(0), rank(1)]), {"GPU-0": 0, "GPU-1": 1})
            await pilot.pause()
            assert table.display and "Ranks (2)" in str(table.render())
            table.show(None, {})
            await pilot.pause()
            assert not table.display

    run(body())
