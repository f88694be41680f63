"""A fake backend over three hosts, one of them down: the hosts tab and the runs' host column
without ssh (the real thing is driven through sshd in tests/fleet)."""

from __future__ import annotations

from gpuwarden.client.fleet_view import FleetGpu
from gpuwarden.client.hosts import HostAnswer
from gpuwarden.core.errors import UserError
from gpuwarden.tui.backend import RunRow
from tests.tui.fake_backend import FakeBackend

GIB = 1024**3
HOSTS = ["gpu1", "gpu2", "gpu3"]


def _gpu(
    host: str, index: int, name: str, total: int, free: int, util: float, power: float, *runs: str
) -> FleetGpu:
    return FleetGpu(
        host=host,
        index=index,
        name=name,
        uuid=f"GPU-{host}-{index}",
        mem_total=total * GIB,
        mem_free=free * GIB,
        util=util,
        power_w=power,
        power_limit_w=700.0,
        runs=runs,
    )


class FakeFleet(FakeBackend):
    """FakeBackend's runs spread over gpu1 and gpu2; gpu3 does not answer."""

    def __init__(self) -> None:
        super().__init__()
        self.host_names = list(HOSTS)

    def gpu_rows(self) -> list[HostAnswer[list[FleetGpu]]]:
        return [
            HostAnswer(
                "gpu1",
                value=[
                    _gpu("gpu1", 0, "NVIDIA H100 80GB HBM3", 80, 12, 97, 655, "r1a2b3c4d5e"),
                    _gpu("gpu1", 1, "NVIDIA H100 80GB HBM3", 80, 79, 0, 71),
                ],
            ),
            HostAnswer(
                "gpu2", value=[_gpu("gpu2", 0, "NVIDIA A100-SXM4-80GB", 80, 41, 55, 300, "r9f8e7d6c5b")]
            ),
            HostAnswer("gpu3", error="ssh: connect timed out", code="ssh"),
        ]

    def runs(self) -> list[RunRow]:
        rows = super().runs()
        return [r.model_copy(update={"host": HOSTS[i % 2]}) for i, r in enumerate(rows)]

    def submit_to(self, host: str, spec_path: str) -> str:
        if host not in HOSTS[:2]:
            raise UserError(f"host {host}: ssh: connect timed out")
        return self.submit(spec_path)
