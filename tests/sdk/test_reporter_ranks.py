"""A user's script under torchrun: each rank reports to its own file, with its rank, where the
daemon's tail of that rank reads (`gpuwarden.core.gang.files`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.core.gang.files import rank_event_files, rank_events_path
from gpuwarden.sdk.reporter import ENV_EVENTS_FILE, Reporter


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_each_rank_writes_its_own_file_with_its_rank(
    rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(ENV_EVENTS_FILE, str(events))
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    Reporter().progress(step=1, samples_seen=8)
    path = rank_events_path(events, rank)
    assert rank_event_files(events) == {rank: path}
    (line,) = path.read_text().splitlines()
    event = json.loads(line)
    assert event["rank"] == rank and event["type"] == "progress"


def test_one_process_writes_the_attempts_file_without_a_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(ENV_EVENTS_FILE, str(events))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    Reporter().progress(step=1, samples_seen=8)
    assert "rank" not in json.loads(events.read_text())
