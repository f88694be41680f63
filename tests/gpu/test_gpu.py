"""On a machine with an NVIDIA GPU: real NVML, and a real CUDA out-of-memory recovered.

A 12 GB card is emulated on a bigger one by capping the run's processes with
`torch.cuda.set_per_process_memory_fraction` (tests/gpu/memcap): the caching allocator then fails
for real, with "allowed" in its message. Skipped (with the reason) where NVML finds no GPU.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle
from tests.gpu.conftest import capped_env, require_cuda

pytestmark = pytest.mark.gpu

GIB = 1 << 30


def test_real_nvml_reader_reads_every_gpu() -> None:
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        assert reader.status is None, reader.status
        gpus = reader.gpus()
        assert gpus and all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
        assert all(g.memory_total and g.memory_total > GIB for g in gpus)
        samples = reader.sample(time.time())
        assert {s.uuid for s in samples} == {g.uuid for g in gpus}
        for s in samples:
            assert not s.lost
            assert s.mem_total and s.mem_used is not None and 0 <= s.mem_used <= s.mem_total
            assert s.temperature_c is None or 0 < s.temperature_c < 120
            assert s.power_w is None or s.power_w >= 0
        reader.processes(time.time())  # must not raise, whatever the driver allows us to see
    finally:
        reader.close()


@pytest.mark.slow
def test_real_cuda_oom_under_a_12gb_cap_is_recovered(daemon_factory: Any) -> None:
    require_cuda()
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""})
    spec = gw.write_spec(
        "cuda-oom",
        f"""
        name: cuda-oom
        kind: train
        env: {json.dumps(capped_env(12))}
        resources: {{gpus: 1}}
        train:
          task: image
          image: {{base_channels: 64, num_blocks: 8, patch_size: 256, synthetic_samples: 1024}}
          batch_size: 512
          grad_accum_steps: 1
          max_steps: 2
          precision: fp32
          log_interval: 1
        """,
    )
    result = gw.cli("run", str(spec), "--follow", timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    detail = gw.cli_json("show", "cuda-oom")
    assert detail["state"] == "succeeded"
    assert detail["effective_batch"] == 512
    first = detail["retunes"][0]
    assert first["verdict"] in ("gpu_capacity", "gpu_fragmentation")
    assert detail["retunes"][-1]["outcome"] == "succeeded"
    assert len(detail["retunes"]) <= 2


def test_real_nvml_topology_reads_links_without_errors() -> None:
    pynvml = pytest.importorskip("pynvml")
    from gpuwarden.core.telemetry.nvml_topology import TopologyGpu, nvlink_peers, read_topology

    pynvml.nvmlInit()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            gpus.append(TopologyGpu(str(pynvml.nvmlDeviceGetUUID(handle)), handle, bus))
        by_bus = {str(g.pci_bus_id): g.uuid for g in gpus}
        for gpu in gpus:  # every link of every GPU answers (or says it has none)
            peers = nvlink_peers(pynvml, gpu, by_bus, pynvml.NVMLError)
            assert all(count > 0 for count in peers.values())
        topology = read_topology(pynvml, gpus, pynvml.NVMLError)
        assert len(topology.links) == len(gpus) * (len(gpus) - 1) // 2
        assert all(link.pcie is not None or link.nvlinks for link in topology.links.values())
    finally:
        pynvml.nvmlShutdown()
