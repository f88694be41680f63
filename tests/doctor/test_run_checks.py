"""Telemetry findings of recorded runs: a CAPTCHA run (power 52 % of the limit) and an image-restoration run (idle
gaps while the CPU is busy), throttling and other processes, with their evidence numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.doctor.diagnose import Diagnosis, diagnose_run
from gpuwarden.core.doctor.finding import Finding
from gpuwarden.core.report.db_data import DbRunData
from gpuwarden.core.telemetry.types import GpuProcess
from tests.report.builders import (
    GIB,
    RTX3060,
    RTX5090,
    T0,
    Recorder,
    captcha_spec,
    restoration_spec,
    training_events,
)

GAPS = (0, 0, 0, 0, 0, 0, 100, 100, 0, 0)  # image restoration: 20 % mean utilisation, idle 80 % of seconds


def _diagnose(path: Path, ref: str) -> Diagnosis:
    data = DbRunData(path)
    try:
        return diagnose_run(data, ref)
    finally:
        data.close()


def _by_id(d: Diagnosis) -> dict[str, Finding]:
    return {f.id: f for f in d.findings}


def record_fp32_captcha_run(rec: Recorder) -> None:
    rec.samples(
        RTX5090,
        T0,
        120,
        lambda i: {
            "power_w": 300.0,
            "power_limit_w": 575.0,
            "util_gpu": 97.0,
            "util_gpu_fine": 96.0,
            "mem_used": 6 * GIB,
            "throttle_reasons": 0,
            "energy_w": 300.0,
        },
        host_cpu=lambda i: 35.0,
    )
    rec.run(
        "captcha",
        captcha_spec(),
        [(T0, T0 + 120, [RTX5090.uuid], 1000)],
        {1: training_events(T0, 120, 256, 256)},
    )


def test_fp32_captcha_run_at_52_percent_power_is_found(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    record_fp32_captcha_run(rec)
    d = _diagnose(tmp_path / "g.db", "captcha")
    found = _by_id(d)
    under = found["gpu-underused"]
    assert under.severity == "warning"
    # utilisation reads 96 %, yet the card draws 300 W of 575 W: power decides
    assert under.evidence == {
        "power_mean_w": 300.0,
        "power_limit_w": 575.0,
        "power_pct": 52.2,
        "samples": 110,  # from the first progress event (+10 s) to the end
        "util_mean_pct": 96.0,
        "util_metric": "util_gpu_fine",
    }
    assert "300 W of its 575 W limit (52 %)" in under.title
    precision = found["precision-fp32"]
    assert precision.severity == "warning"  # the run's GPU (compute 12.0) has bf16
    assert precision.evidence["key"] == "train.amp" and precision.evidence["value"] is False
    assert precision.evidence["mixed_precision_here"] == "bf16"
    assert precision.fix == {"train.precision": "auto", "train.amp": None}
    headroom = found["memory-headroom"]
    assert headroom.evidence == {
        "mem_peak_bytes": 6 * GIB,
        "mem_total_bytes": 32 * GIB,
        "peak_pct": 18.8,
        "batch_size": 256,
    }
    assert headroom.fix == {"train.batch_size": 1024}  # 80 % / 18.75 % → ×4 (capped at 4)
    assert "data-loading-bound" not in found and "throttled-power" not in found
    assert d.device.gpu_name == "NVIDIA GeForce RTX 5090" and d.device.memory_total == 32 * GIB
    # the warnings come before the infos
    severities = [f.severity for f in d.findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def record_restoration_with_idle_gaps(rec: Recorder, other: bool = False) -> None:
    def procs(i: int) -> list[GpuProcess]:
        rows = [GpuProcess(ts=0, uuid="", pid=2000, used_memory=3 * GIB, name="python", cpu_percent=99.0)]
        if other:
            rows.append(GpuProcess(ts=0, uuid="", pid=4242, used_memory=2 * GIB, name="blender"))
        return rows

    rec.samples(
        RTX3060,
        T0,
        100,
        lambda i: {
            "util_gpu": float(GAPS[i % 10]),
            "power_w": 50.0 + 1.2 * GAPS[i % 10],
            "power_limit_w": 170.0,
            "mem_used": 7 * GIB,
        },
        host_cpu=lambda i: 95.0,
        processes=procs,
    )
    rec.run(
        "restore",
        restoration_spec(),
        [(T0, T0 + 100, [RTX3060.uuid], 2000)],
        {1: training_events(T0, 100, 16, 16)},
    )


def test_idle_gaps_while_the_cpu_is_busy_point_at_num_workers(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    record_restoration_with_idle_gaps(rec)
    found = _by_id(_diagnose(tmp_path / "g.db", "restore"))
    gaps = found["data-loading-bound"]
    assert gaps.severity == "warning"
    # 90 samples from +10 s: 72 of them at 0 %
    assert gaps.evidence == {
        "gap_share_pct": 80.0,
        "gap_below_util_pct": 30.0,
        "samples": 90,
        "util_metric": "util_gpu",
        "host_cpu_mean_pct": 95.0,
        "process_cpu_mean_pct": 99.0,
        "num_workers": 0,
    }
    assert gaps.fix == {"train.num_workers": "auto"}
    under = found["gpu-underused"]
    assert under.evidence["power_pct"] == pytest.approx(round(100 * 74.0 / 170, 1))
    assert under.evidence["util_mean_pct"] == 20.0
    # the static side says the same thing about the spec
    assert found["data-loading-main-process"].evidence["key"] == "train.num_workers"
    assert "other-processes" not in found


def test_idle_gaps_with_an_idle_cpu_are_not_blamed_on_data_loading(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    rec.samples(RTX3060, T0, 100, lambda i: {"util_gpu": float(GAPS[i % 10])}, host_cpu=lambda i: 10.0)
    rec.run(
        "quiet",
        restoration_spec(),
        [(T0, T0 + 100, [RTX3060.uuid], 3)],
        {1: training_events(T0, 100, 16, 16)},
    )
    found = _by_id(_diagnose(tmp_path / "g.db", "quiet"))
    assert "data-loading-bound" not in found
    assert found["gpu-underused"].evidence == {"util_mean_pct": 20.0, "util_metric": "util_gpu"}


def test_other_processes_on_the_run_gpu_are_named(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    record_restoration_with_idle_gaps(rec, other=True)
    other = _by_id(_diagnose(tmp_path / "g.db", "restore"))["other-processes"]
    assert other.evidence["processes"] == [
        {"pid": 4242, "name": "blender", "gpus": [RTX3060.uuid], "used_memory_max": 2 * GIB}
    ]
    assert other.evidence["used_memory_total_bytes"] == 2 * GIB


def test_the_runner_started_by_the_attempts_exit_recorder_is_the_runs_own_process(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    rec.samples(
        RTX3060,
        T0,
        100,
        lambda i: {"util_gpu": float(GAPS[i % 10])},
        processes=lambda i: [GpuProcess(ts=0, uuid="", pid=2000, used_memory=3 * GIB, cpu_percent=99.0)],
    )
    events = training_events(T0, 100, 16, 16)
    events[0]["pid"] = 2000  # the runner names itself; the attempt's pid is its recorder's
    rec.run("restore", restoration_spec(), [(T0, T0 + 100, [RTX3060.uuid], 1999)], {1: events})
    found = _by_id(_diagnose(tmp_path / "g.db", "restore"))
    assert "other-processes" not in found
    assert found["data-loading-bound"].evidence["process_cpu_mean_pct"] == 99.0


@pytest.mark.parametrize(
    ("mask", "finding", "severity", "reason"),
    [
        (0x4, "throttled-power", "info", "sw_power_cap"),
        (0x20 | 0x4, "throttled-thermal", "warning", "sw_thermal"),
    ],
)
def test_throttling_share_and_reasons(
    tmp_path: Path, mask: int, finding: str, severity: str, reason: str
) -> None:
    rec = Recorder(tmp_path / "g.db")
    # throttled in 3 of every 10 seconds
    fields: Any = lambda i: {  # noqa: E731 - a table row, read once
        "power_w": 560.0,
        "power_limit_w": 575.0,
        "util_gpu": 100.0,
        "mem_used": 30 * GIB,
        "temperature_c": 70.0 + i % 10,
        "throttle_reasons": mask if i % 10 < 3 else 0,
    }
    rec.samples(RTX5090, T0, 100, fields)
    rec.run("hot", captcha_spec(), [(T0, T0 + 100, [RTX5090.uuid], 5)], {1: training_events(T0, 100, 8, 8)})
    found = _by_id(_diagnose(tmp_path / "g.db", "hot"))
    f = found[finding]
    assert f.severity == severity
    assert f.evidence["throttled_pct"] == 30.0 and f.evidence["reasons_pct"][reason] == 30.0
    assert f.evidence["samples"] == 90 and f.evidence["temperature_max_c"] == 79.0
    assert "gpu-underused" not in found and "memory-headroom" not in found


def test_cpu_run_skips_telemetry_checks_with_a_note(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "g.db")
    rec.run("cpu", captcha_spec(4), [(T0, T0 + 30, [], 9)], {1: training_events(T0, 30, 4, 4)})
    d = _diagnose(tmp_path / "g.db", "cpu")
    assert d.device.device == "cpu"
    assert any("used no GPU" in n for n in d.notes)
    assert {f.severity for f in d.findings} == {"info"}  # GPU-only advice on a CPU run is info at most
