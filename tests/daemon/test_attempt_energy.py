"""An attempt's energy is its GPUs' energy counters read as it started and as it ended, however
short it is next to the sampling interval: a 5-s cadence and an attempt of a second or two."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.client import ApiClient
from gpuwarden.core.config.settings import Settings
from gpuwarden.core.paths import Paths
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.daemon.daemon import Daemon
from tests.daemon.conftest import command_spec, wait_for

pytestmark = pytest.mark.slow

SAMPLE_INTERVAL_S = 5.0
GPU_SECONDS = 2.5  # what the fake GPU's clock moves while the attempt runs


class StoppedClock:
    """The fake GPU's clock: still until the test moves it, so the counter's value at each moment
    the daemon reads it is known exactly."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(short_tmp: Path) -> Iterator[tuple[Daemon, FakeNvml, StoppedClock]]:
    clock = StoppedClock()
    fake = FakeNvml("h100", clock=clock)
    paths = Paths(
        state_dir=short_tmp / "state", runtime_dir=short_tmp / "run", db=short_tmp / "state" / "g.db"
    )
    daemon = Daemon(Settings(sample_interval=SAMPLE_INTERVAL_S), paths, gpu_reader=NvmlReader(fake))
    daemon.start()
    server = threading.Thread(target=daemon.serve, name="api", daemon=True)
    server.start()
    try:
        wait_for(paths.socket.exists, "the daemon's socket")
        yield daemon, fake, clock
    finally:
        daemon.request_shutdown()
        server.join(timeout=30)
        daemon.close()
        for active in list(daemon.supervisor.active.values()):
            os.killpg(active.child.pid, 9)


def test_an_attempt_shorter_than_the_sampling_interval_reads_its_counter_difference(
    served: tuple[Daemon, FakeNvml, StoppedClock], short_tmp: Path
) -> None:
    daemon, fake, clock = served
    go = short_tmp / "go"
    code = f"""
        import os, time
        deadline = time.monotonic() + 120
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.02)
    """
    with ApiClient(daemon.paths.socket, timeout=30) as client:
        run_id = client.submit(command_spec("short", code)).id
        wait_for(lambda: client.run(run_id).state == "running", "the attempt to run")
        # Right after a tick, so the next one comes after the attempt's end: the samples see none
        # of the energy it used.
        last = daemon.sampling.latest_tick
        wait_for(lambda: daemon.sampling.latest_tick is not last, "a sample", timeout=3 * SAMPLE_INTERVAL_S)
        started = clock.now
        clock.now += GPU_SECONDS
        go.touch()
        wait_for(lambda: client.run(run_id).state == "succeeded", "the attempt to end")
        detail = client.run(run_id)
    expected_j = (fake.energy_mj(0, started + GPU_SECONDS) - fake.energy_mj(0, started)) / 1000
    assert expected_j > 100  # an H100 idles at tens of watts: 2.5 s is hundreds of joules
    energy = detail.energy.model_dump()
    (attempt,) = energy["per_attempt"]
    assert attempt["joules"] == pytest.approx(expected_j, abs=0.001)
    assert energy["joules"] == pytest.approx(expected_j, abs=0.001)
    (gpu,) = detail.attempts[0].gpus
    assert detail.attempts[0].gpu_energy_j == {gpu: pytest.approx(expected_j, abs=0.001)}
