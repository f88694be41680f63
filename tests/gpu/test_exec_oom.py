"""On a machine with an NVIDIA GPU: a real CUDA out-of-memory recovered by `gpuwarden exec`, the
job-scoped supervisor, with no daemon (a cluster job's case). The card is capped at 12 GB as in
test_gpu.py; the run's record is its folder's store, read back with `show --runs`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle
from tests.gpu.conftest import capped_env, require_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_a_real_cuda_oom_is_retuned_inside_a_job_by_gpuwarden_exec(daemon_factory: Any) -> None:
    require_cuda()
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""}, start=False)
    spec = gw.root / "cuda-oom.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""
            name: cuda-oom-exec
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
            """
        )
    )
    runs = gw.root / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "exec", str(spec), "--runs", str(runs)],
        env=gw.env,
        cwd=gw.root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert not gw.socket.exists()  # no daemon was involved
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    shown = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "show", "--runs", str(runs), folder.name, "--json"],
        env=gw.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    detail = json.loads(shown.stdout)
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 512
    assert detail["retunes"][0]["verdict"] in ("gpu_capacity", "gpu_fragmentation")
    assert detail["retunes"][-1]["outcome"] == "succeeded"
    assert Path(detail["run_dir"]) == folder
