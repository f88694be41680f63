"""Live state without an app: the frame buffer, energy accounting, formatting helpers."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.telemetry.types import GpuSample
from gpuwarden.core.units import duration
from gpuwarden.tui.backend import EventFrame, RunFrame, RunRow, SampleFrame, Snapshot, TimelineEvent
from gpuwarden.tui.formatting import bar, eta_seconds, progress_fraction
from gpuwarden.tui.live import EnergyMeter, FrameBuffer, LiveState
from tests.tui.fake_backend import FROZEN_TS, FakeBackend


def _sample(ts: float, **kw: float | int | None) -> GpuSample:
    return GpuSample(ts=ts, uuid="GPU-x", **kw)  # type: ignore[arg-type]


def _row(state: str, **view: Any) -> RunRow:
    return RunRow(id="r1", name="n", kind="train", state=state, attempt=1, message=None, created_at=0.0,
                  updated_at=0.0, started_at=None, ended_at=None, gpus=1, **view)  # fmt: skip


def test_buffer_drops_oldest_samples_first_and_keeps_run_frames() -> None:
    buf = FrameBuffer(max_samples=2)
    run = _row("running")
    buf.put(SampleFrame(Snapshot(1.0)))
    buf.put(RunFrame(run))
    buf.put(SampleFrame(Snapshot(2.0)))
    buf.put(SampleFrame(Snapshot(3.0)))
    frames = buf.drain()
    assert buf.dropped == 1
    assert [f.snapshot.ts for f in frames if isinstance(f, SampleFrame)] == [2.0, 3.0]
    assert any(isinstance(f, RunFrame) for f in frames)
    assert len(buf) == 0


def test_energy_from_counter_survives_a_reset() -> None:
    meter = EnergyMeter()
    meter.add(_sample(0.0, energy_mj=10_000))
    meter.add(_sample(1.0, energy_mj=15_000))  # +5 J
    meter.add(_sample(2.0, energy_mj=2_000))  # reset: 2 J since
    assert meter.joules == 7.0


def test_energy_integrates_power_without_a_counter() -> None:
    meter = EnergyMeter()
    meter.add(_sample(0.0, power_w=100.0))
    meter.add(_sample(2.0, power_w=200.0))  # trapezoid: 150 W × 2 s
    meter.add(_sample(3.0, lost=True))  # lost ticks add nothing  # type: ignore[arg-type]
    assert meter.joules == 300.0


def test_live_state_folds_frames_and_ignores_repeated_ticks() -> None:
    fake = FakeBackend()
    live = LiveState()
    live.set_gpus(fake.gpus())
    snap = fake.snapshot()
    event = TimelineEvent(1, "ra1b2c3d4e5", 1, FROZEN_TS, "state", "stopped")
    changes = live.apply([SampleFrame(snap), SampleFrame(snap), EventFrame(event)])
    uuid = snap.gpus[0].uuid
    assert len(live.gpus[uuid].series["util_gpu"]) == 1  # the repeat was not counted twice
    assert changes.samples and changes.processes and changes.events == [event]
    live.set_runs(fake.runs())
    assert [r.state for r in live.runs_sorted()][:2] == ["running", "queued"]


def test_progress_eta_and_bars() -> None:
    run = _row("running", samples_seen=250, total=1000, samples_per_s=5.0)
    assert progress_fraction(run) == 0.25
    assert eta_seconds(run) == 150.0
    assert eta_seconds(_row("stopped", samples_seen=1, total=2, samples_per_s=1.0)) is None
    assert duration(3725) == "1h02m" and duration(59) == "59s" and duration(None) == "–"
    assert bar(0.5, 4) == "██  " and bar(None, 3) == "   " and bar(1.0, 2) == "██"
