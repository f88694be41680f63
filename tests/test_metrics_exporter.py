"""The Prometheus exporter over real HTTP: dcgm-exporter names, units, and run series."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample
from gpuwarden.daemon.metrics import MetricsServer, start_metrics_server

MIB = 1024**2


class Source:
    def __init__(self) -> None:
        self.gpus: list[tuple[GpuStatic, GpuSample | None]] = [
            (
                GpuStatic(uuid="GPU-a", index=0, name="NVIDIA H100"),
                GpuSample(
                    ts=1.0,
                    uuid="GPU-a",
                    util_gpu=87,
                    util_mem=40,
                    mem_used=4096 * MIB,
                    mem_total=81559 * MIB,
                    power_w=350.5,
                    power_limit_w=700,
                    energy_mj=123456789,
                    temperature_c=61,
                    sm_clock_mhz=1980,
                    mem_clock_mhz=2619,
                    throttle_reasons=0x4,
                    fan_pct=None,
                    pstate=0,
                ),
            ),
            (
                GpuStatic(uuid="GPU-b", index=1, name="NVIDIA H100"),
                GpuSample(ts=1.0, uuid="GPU-b", lost=True),
            ),
        ]
        self.runs: list[dict[str, Any]] = [
            {
                "id": "r1",
                "name": "llm",
                "kind": "train",
                "state": "running",
                "attempts": 2,
                "retunes": 1,
                "samples_per_s": 12.5,
                "loss": 2.25,
            },
        ]

    def gpu_snapshot(self) -> list[tuple[GpuStatic, GpuSample | None]]:
        return self.gpus

    def host_snapshot(self) -> HostSample | None:
        return HostSample(ts=1.0, cpu_percent=12.0, mem_used=2 * 1024**3, mem_total=24 * 1024**3, load1=0.5)

    def runs_snapshot(self) -> list[dict[str, Any]]:
        return self.runs


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = start_metrics_server(Source(), "127.0.0.1", 0)
    yield s
    s.close()


def _scrape(server: MetricsServer) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
    assert r.status_code == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_dcgm_names_units_and_labels(server: MetricsServer) -> None:
    m = _scrape(server)
    ((labels, util),) = m["DCGM_FI_DEV_GPU_UTIL"]
    assert util == 87
    assert labels == {
        "gpu": "0",
        "UUID": "GPU-a",
        "device": "nvidia0",
        "modelName": "NVIDIA H100",
        "Hostname": labels["Hostname"],
    }
    assert m["DCGM_FI_DEV_FB_USED"][0][1] == 4096  # MiB, like dcgm-exporter
    assert m["DCGM_FI_DEV_FB_FREE"][0][1] == 81559 - 4096
    assert m["DCGM_FI_DEV_POWER_USAGE"][0][1] == 350.5
    assert m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0][1] == 123456789
    assert m["gpuwarden_gpu_energy_joules_total"][0][1] == 123456.789
    assert m["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][0][1] == 4
    assert "DCGM_FI_DEV_FAN_SPEED" not in m  # unsupported → absent, never a fake zero
    lost = {lab["UUID"]: v for lab, v in m["gpuwarden_gpu_lost"]}
    assert lost == {"GPU-a": 0, "GPU-b": 1}
    assert m["gpuwarden_host_cpu_percent"][0][1] == 12


def test_run_series(server: MetricsServer) -> None:
    m = _scrape(server)
    states = {lab["state"]: v for lab, v in m["gpuwarden_run_state"]}
    assert states["running"] == 1 and states["failed"] == 0
    assert m["gpuwarden_run_attempts"][0][1] == 2
    assert m["gpuwarden_run_retunes_total"][0][1] == 1
    assert m["gpuwarden_run_samples_per_second"][0][1] == 12.5  # units spelled out (promtool)
