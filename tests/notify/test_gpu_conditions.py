"""GPU conditions from real ticks: the sampler reads the fake NVML (one GPU idle under a run,
another hot), and the messages reach a real receiver through apprise's json://."""

from __future__ import annotations

from gpuwarden.core.config.settings import NotifySettings
from gpuwarden.core.notify.rules import RunFacts
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.sampler import Sampler
from gpuwarden.daemon.notify.notifications import Notifications
from gpuwarden.daemon.notify.targets import AppriseTarget
from tests.daemon.conftest import wait_for
from tests.notify.conftest import Receiver

HW_THERMAL, SW_POWER_CAP = 0x40, 0x4


def test_an_idle_gpu_under_a_run_and_a_hot_gpu_are_told_once(receiver: Receiver) -> None:
    fake = FakeNvml("h100x2")  # virtual time: `advance` moves it
    reader = NvmlReader(fake, enrich=lambda rows: None)
    sampler = Sampler(reader, None, process_interval=5.0, clock=lambda: fake.time)
    fake.set_load(0, 0)
    fake.set_load(1, 100)
    fake.set_throttle(1, HW_THERMAL | SW_POWER_CAP)
    settings = NotifySettings(urls=[receiver.url], idle_minutes=1, throttle_minutes=2)
    names = {g.uuid: f"{g.index} ({g.uuid})" for g in reader.gpus()}
    notes = Notifications(
        settings,
        lambda run_id: RunFacts(run_id, "bert"),
        lambda *failed: None,
        "box",
        gpu_names=lambda: names,
    )
    notes.start([AppriseTarget(receiver.url, timeout=10)])
    try:
        for _ in range(200):  # 200 s of ticks
            notes.offer_tick(sampler.tick(), {fake.uuid(0): ("r1",)})
            fake.advance(1)
        wait_for(lambda: len(receiver.posts) >= 2, "both conditions at the receiver")
    finally:
        notes.stop()
    idle, hot = sorted(receiver.posts, key=lambda p: "throttled" in p["title"])
    gpu0, gpu1 = names[fake.uuid(0)], names[fake.uuid(1)]
    assert idle["title"] == f"bert: GPU {gpu0} idle"
    assert (
        idle["message"]
        == f"GPU {gpu0}, held by run bert (r1) on box, has been idle (under 5% busy) for 1 min."
    )
    assert hot["title"] == f"box: GPU {gpu1} throttled"
    assert hot["message"] == f"GPU {gpu1}, used by no run, on box, has been throttled (hw_thermal) for 2 min."
    assert len(receiver.posts) == 2  # once per episode
