"""Reading how a gang attempt ended: each rank's events, its error file, torchrun's summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuwarden.core.events import EXIT_GANG_ABORTED, EXIT_OOM
from gpuwarden.core.gang.files import rank_event_files, rank_events_path, rank_logs
from gpuwarden.core.gang.outcome import parse_torchrun_failures, read_gang_outcome

# torchrun's summary as it printed it for a rank 1 OOM (trimmed)
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
gpuwarden.runners FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_20:29:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 4 (pid: 29770)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_20:29:10
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 29771)
  error_file: /x/error.json
  traceback : rank 1: oom (host_oom): DefaultCPUAllocator: can't allocate memory
============================================================
"""
KILLED = SUMMARY.replace("exitcode  : 3 (pid: 29771)", "exitcode  : -9 (pid: 29771)  (SIGKILL)")


def write_events(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"v": 1, **e}) + "\n" for e in events), encoding="utf-8")


def test_rank_files_are_found_by_rank(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    assert rank_events_path(events, 0) == events
    assert rank_events_path(events, 3) == tmp_path / "events.rank3.jsonl"
    for rank in (0, 1, 12):
        write_events(rank_events_path(events, rank), [])
    assert list(rank_event_files(events)) == [0, 1, 12]
    (tmp_path / "ranks" / "abc_1" / "attempt_0" / "1").mkdir(parents=True)
    assert rank_logs(tmp_path)[1].error_file == tmp_path / "ranks/abc_1/attempt_0/1/error.json"


def test_torchruns_summary_gives_each_failed_rank_and_the_root_cause() -> None:
    failures = parse_torchrun_failures(SUMMARY)
    assert failures.exit_codes == {0: EXIT_GANG_ABORTED, 1: EXIT_OOM} and failures.root_cause == 1
    assert parse_torchrun_failures(KILLED).exit_codes[1] == -9
    assert parse_torchrun_failures("").exit_codes == {}


def test_the_rank_that_ran_out_of_memory_is_the_cause_not_the_one_it_left_waiting(tmp_path: Path) -> None:
    write_events(
        tmp_path / "events.jsonl",
        [
            {"type": "progress", "ts": 1.0, "rank": 0, "step": 3},
            {"type": "error", "ts": 5.0, "rank": 0, "code": "gang_aborted", "message": "rank 0 stopped"},
        ],
    )
    write_events(
        tmp_path / "events.rank1.jsonl",
        [
            {"type": "progress", "ts": 1.0, "rank": 1, "step": 3},
            {"type": "oom", "ts": 4.0, "rank": 1, "verdict": "host_oom", "message": "can't allocate"},
        ],
    )
    error_file = tmp_path / "ranks" / "id_x" / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    error_file.write_text(json.dumps({"message": {"message": "rank 1"}, "exitcode": 3}), encoding="utf-8")
    outcome = read_gang_outcome(tmp_path, 2, SUMMARY)
    assert outcome.first_failure is not None and outcome.first_failure.rank == 1
    assert outcome.first_failure.message == "out of memory (host_oom): can't allocate"
    zero, one = outcome.ranks
    assert (zero.exit_code, zero.last_event, zero.caused) == (EXIT_GANG_ABORTED, "error", False)
    assert (one.exit_code, one.last_event, one.caused) == (EXIT_OOM, "oom", True)


def test_a_rank_killed_without_a_word_is_found_through_torchrun(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", [{"type": "progress", "ts": 1.0, "rank": 0, "step": 3}])
    write_events(tmp_path / "events.rank1.jsonl", [{"type": "progress", "ts": 1.0, "rank": 1, "step": 3}])
    outcome = read_gang_outcome(tmp_path, 2, KILLED)
    assert outcome.first_failure is not None and outcome.first_failure.rank == 1
    assert outcome.first_failure.exit_code == -9 and outcome.first_failure.failure is None


def test_a_clean_gang_has_no_failure_and_missing_files_are_not_errors(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", [{"type": "finished", "ts": 2.0, "rank": 0, "report": {}}])
    outcome = read_gang_outcome(tmp_path, 2, "")
    assert outcome.first_failure is None
    assert [r.last_event for r in outcome.ranks] == ["finished", None]
