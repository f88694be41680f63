"""J/sample and samples/kWh of a run in its detail over the API, as the dashboard reads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon.conftest import DaemonHandle
from tests.daemon.module_daemon import module_daemon

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


def _train(name: str, gpus: int) -> dict[str, object]:
    return {
        "name": name,
        "kind": "train",
        "resources": {"gpus": gpus},
        "env": {"OMP_NUM_THREADS": "1"},
        "train": {
            "task": "image",
            "image": {"base_channels": 8, "num_blocks": 1, "patch_size": 32, "synthetic_samples": 64},
            "batch_size": 4,
            "grad_accum_steps": 2,
            "max_steps": 6,
            "log_interval": 1,
        },
    }


def test_a_run_on_a_gpu_shows_its_energy_per_sample_and_the_report_agrees(gw: DaemonHandle) -> None:
    run = gw.wait_state(gw.submit(_train("energetic", 1))["id"], timeout=120)
    assert run["state"] == "succeeded", run["message"]
    with gw.client() as client:
        energy = client.run(run["id"]).energy.model_dump()
    assert energy["samples"] == 6 * 4 * 2
    assert energy["joules"] > 0  # the fake H100 draws at least its idle power
    assert energy["per_sample_j"] == pytest.approx(energy["joules"] / 48)
    assert energy["samples_per_kwh"] == pytest.approx(3.6e6 / energy["per_sample_j"])
    (attempt,) = energy["per_attempt"]
    assert attempt["attempt"] == 1 and attempt["samples"] == 48
    assert attempt["joules"] == pytest.approx(energy["joules"])
    report = gw.cli_json("report", run["id"])["energy"]
    assert report["joules"] == pytest.approx(energy["joules"], rel=0.02)
    assert report["samples_per_kwh"] == pytest.approx(energy["samples_per_kwh"], rel=0.02)


def test_a_cpu_run_has_no_energy_reading(gw: DaemonHandle) -> None:
    run = gw.wait_state(gw.submit(_train("cpu-only", 0))["id"], timeout=120)
    assert run["state"] == "succeeded", run["message"]
    with gw.client() as client:
        energy = client.run(run["id"]).energy.model_dump()
    assert energy["joules"] is None and energy["per_sample_j"] is None and energy["samples_per_kwh"] is None
    assert energy["per_attempt"] == [
        {"attempt": 1, "joules": None, "samples": 48, "per_sample_j": None, "samples_per_kwh": None}
    ]
