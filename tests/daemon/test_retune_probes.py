"""A retune's probes told as they run: a note when each starts, while it runs, and when it ends
(the real retune's events: tests/daemon/test_e2e_oom_recovery.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuwarden.core.oom.recovery import ProbeTurn
from gpuwarden.daemon.retune_probes import WatchedProbes
from gpuwarden.daemon.supervise import RetuneGiveUp

GIB = 1 << 30


class Notes:
    """What the probes said, in order; `running` is set by the first note of a running probe."""

    def __init__(self) -> None:
        self.said: list[dict[str, Any]] = []
        self.running = threading.Event()

    def __call__(self, type_: str, /, **payload: Any) -> None:
        assert type_ == "probe"
        self.said.append(payload)
        if payload["phase"] == "running":
            self.running.set()

    @property
    def messages(self) -> list[str]:
        return [str(p["message"]) for p in self.said]


def test_a_probe_is_told_when_it_starts_and_when_it_ends_with_what_it_measured() -> None:
    notes = Notes()
    ticks = iter([100.0, 104.12, 200.0, 203.0, 300.0, 301.0])
    probes = WatchedProbes(notes, clock=lambda: next(ticks), heartbeat_s=3600)
    results = {4: (int(1.5 * GIB), False), 16: (None, True), 8: (None, False)}
    probe = probes.watch(lambda batch: results[batch])
    for turn in (ProbeTurn(1, 2, 4, 8), ProbeTurn(2, 3, 16, 2), ProbeTurn(3, 3, 8, 4)):
        probes.turn(turn)
        assert probe(turn.batch_size) == results[turn.batch_size]
    assert notes.messages == [
        "probe 1 of 2: micro-batch 4 × 8 starting",
        "probe 1 of 2: micro-batch 4 → peak 1.5 GiB, fits (4.1 s)",
        "probe 2 of 3: micro-batch 16 × 2 starting",
        "probe 2 of 3: micro-batch 16 → out of memory (3.0 s)",
        "probe 3 of 3: micro-batch 8 × 4 starting",
        "probe 3 of 3: micro-batch 8 → no measurement (1.0 s)",
    ]
    first_end = notes.said[1]
    assert {
        k: first_end[k] for k in ("phase", "number", "planned", "batch_size", "mem_peak", "fits", "oom")
    } == {
        "phase": "ended",
        "number": 1,
        "planned": 2,
        "batch_size": 4,
        "mem_peak": int(1.5 * GIB),
        "fits": True,
        "oom": False,
    }
    assert first_end["seconds"] == 4.1


def test_a_probe_that_runs_long_is_told_every_few_seconds_while_it_runs() -> None:
    notes = Notes()
    probes = WatchedProbes(notes, heartbeat_s=0.01)

    def slow(batch: int) -> tuple[int | None, bool]:
        assert notes.running.wait(timeout=30), "no note while the probe ran"
        return GIB, False

    probes.turn(ProbeTurn(1, 2, 4, None))
    probes.watch(slow)(4)
    phases = [p["phase"] for p in notes.said]
    assert phases[0] == "started" and phases[-1] == "ended"
    assert set(phases[1:-1]) == {"running"} and phases[1:-1]
    assert notes.messages[1].startswith("probe 1 of 2: micro-batch 4 running, ")
    assert notes.messages[0] == "probe 1 of 2: micro-batch 4 starting", "no accumulation: none said"


def test_a_stopped_run_starts_no_probe_and_tells_none() -> None:
    notes = Notes()
    ran: list[int] = []
    probes = WatchedProbes(notes, stopped=lambda: True)

    def probe(batch: int) -> tuple[int | None, bool]:
        ran.append(batch)
        return GIB, False

    with pytest.raises(RetuneGiveUp, match="stopped while probing"):
        probes.watch(probe)(4)
    assert ran == [] and notes.said == []


def test_a_probe_the_plan_did_not_announce_is_counted_by_itself() -> None:
    notes = Notes()
    probe = WatchedProbes(notes).watch(lambda batch: (GIB, False))
    probe(4)
    probe(8)
    assert [m.split(" → ")[0] for m in notes.messages[1::2]] == [
        "probe 1 of 1: micro-batch 4",
        "probe 2 of 2: micro-batch 8",
    ]
