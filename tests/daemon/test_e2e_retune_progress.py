"""A retune is seen while it happens: the shipped CPU example runs out of memory for real, and
each of the retune's probes is an event of the run as it starts, runs and ends — in `run
--follow`, `events`, `show` — with never more than a few seconds of silence in between."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.core.api import RunEvent
from tests.daemon.conftest import REPO, DaemonHandle, wait_for

EXAMPLE = (REPO / "configs" / "examples" / "oom-recovery-cpu.yaml").read_text()
SILENCE_S = 5.0  # the longest a retuning run may go without an event
# `probe 2 of 2: micro-batch 16 → peak 1.3 GiB, fits (9.8 s)`
ENDED = re.compile(r"probe (\d) of 2: micro-batch (\d+) → peak [\d.]+ [KMG]iB, fits \([\d.]+ s\)$")


def _events(gw: DaemonHandle, run_id: str) -> list[RunEvent]:
    with gw.client() as client:
        return client.events(run_id, limit=10_000).events


def _retuning(gw: DaemonHandle, run_id: str) -> list[RunEvent]:
    """The run's events from its move to `retuning` to its `retuned` (or the last so far)."""
    events = _events(gw, run_id)
    start = next(
        (
            i
            for i, e in enumerate(events)
            if e.type == "state" and (e.model_extra or {})["state"] == "retuning"
        ),
        None,
    )
    if start is None:
        return []
    end = next((i for i, e in enumerate(events) if e.type == "retuned"), len(events) - 1)
    return events[start : end + 1]


def _probe_messages(events: list[RunEvent], phase: str) -> list[str]:
    return [
        str((e.model_extra or {})["message"])
        for e in events
        if e.type == "probe" and (e.model_extra or {}).get("phase") == phase
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_probe_of_a_real_retune_is_told_as_it_runs(gw: DaemonHandle, tmp_path: Path) -> None:
    spec = gw.write_spec("oom-recovery-cpu", EXAMPLE)
    followed = tmp_path / "follow-stderr.txt"
    with followed.open("w") as err:
        follow = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "run", str(spec), "--follow"],
            env=gw.env,
            cwd=gw.root,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    run_id = wait_for(lambda: [r.id for r in gw.client().runs()], "the run submitted")[0]

    # While the retune decides, `show` says which probe runs now.
    def probing_or_over() -> bool:
        return bool(_probe_messages(_retuning(gw, run_id), "started")) or follow.poll() is not None

    wait_for(probing_or_over, "a probe starting", timeout=300)
    shown = gw.cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "state:    retuning" in shown.stdout, shown.stdout
    at = lines.index("retuning after attempt 1:")
    assert lines[at + 1].startswith("    probe 1 of 2: micro-batch 4"), shown.stdout

    assert follow.wait(timeout=500) == 0, followed.read_text()[-3000:]
    retune = _retuning(gw, run_id)
    assert retune[-1].type == "retuned"
    # Never silent: no two consecutive events of the retune further apart than SILENCE_S.
    gaps = [round(b.ts - a.ts, 2) for a, b in itertools.pairwise(retune)]
    assert max(gaps) <= SILENCE_S, list(zip([e.type for e in retune[1:]], gaps, strict=True))
    ended = _probe_messages(retune, "ended")
    assert [ENDED.match(m).groups() for m in ended] == [("1", "4"), ("2", "16")], ended  # type: ignore[union-attr]
    assert _probe_messages(retune, "started") == [
        "probe 1 of 2: micro-batch 4 × 8 starting",
        "probe 2 of 2: micro-batch 16 × 2 starting",
    ]
    assert all(e.attempt == 1 and e.source == "daemon" for e in retune if e.type == "probe")

    # Every reader says them: the follower as they came, `events` and `show` afterwards.
    said = followed.read_text()
    assert all(f"probe: {message}" in said for message in ended), said
    listed = gw.cli("events", run_id).stdout
    assert all(f"probe: {message}" in listed for message in ended), listed
    shown_after = gw.cli("show", run_id).stdout.splitlines()
    under = shown_after.index(next(line for line in shown_after if line.startswith("retune after attempt 1")))
    assert shown_after[under + 2 : under + 4] == [f"    {message}" for message in ended], shown_after
