"""The restart policy with real runners: killed by a signal, restarted from the checkpoint."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

# Attempt 1 holds at step 20, right after that step's checkpoint, until the test kills it: the
# kill lands mid-run however fast or slow the machine is. The restarted attempt, resumed from that
# checkpoint, goes on to the end (see stall_hook).
TRAIN = """
    name: {name}
    kind: train
    env: {{OMP_NUM_THREADS: "1", {stall}: "0:20"}}
    resources: {{gpus: 0}}
    restart: {{on: [signal, exit_code: [75]], max: 2, backoff: 0.5}}
    train:
      task: image
      batch_size: 4
      max_steps: 40
      log_interval: 10
      checkpoint_interval: 20
      image: {{base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 64}}
"""


def _events(gw: DaemonHandle, run_id: str, type_: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [e.model_dump() for e in client.events(run_id, limit=10_000).events if e.type == type_]


@pytest.mark.slow
def test_a_runner_killed_by_a_signal_restarts_from_its_checkpoint_and_finishes(gw: DaemonHandle) -> None:
    spec = gw.write_spec("restarting", TRAIN.format(name="restarting", stall=STALL_ENV))
    run = gw.cli_json("run", str(spec))
    pid = gw.wait_state(run["id"], ("running",), timeout=60)["attempts"][0]["pid"]
    wait_for(lambda: _events(gw, run["id"], "checkpoint"), "a first complete checkpoint", timeout=120)
    os.kill(pid, signal.SIGKILL)
    done = gw.wait_state(run["id"], timeout=300)
    assert done["state"] == "succeeded", done["message"]
    first, second = done["attempts"]
    assert first["classification"] == "failed" and first["signal"] == signal.SIGKILL
    assert second["classification"] == "succeeded" and second["restart"] is None
    assert first["restart"] == {"cause": "killed by SIGKILL", "restart": 1, "max": 2, "backoff_s": 0.5}
    (restart,) = _events(gw, run["id"], "restart")
    assert restart["attempt"] == 1 and restart["cause"] == "killed by SIGKILL"
    started = [e for e in _events(gw, run["id"], "started") if e["attempt"] == 2]
    assert started and started[0]["resumed_from"], "attempt 2 resumed from the checkpoint"
    steps = {n: [e["step"] for e in _events(gw, run["id"], "progress") if e["attempt"] == n] for n in (1, 2)}
    assert steps[1][-1] == 20  # held at the stall until killed
    assert steps[2][0] > 20 and steps[2][-1] == 40  # counted on from the checkpoint, to the end
    shown = gw.cli("show", run["id"])
    assert "restart 1 of 2 after 0.5 s: killed by SIGKILL" in shown.stdout, shown.stdout


def test_without_the_policy_a_killed_run_fails_and_max_is_honoured(gw: DaemonHandle) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    plain = gw.submit(command_spec("plain", code))
    limited = gw.submit(command_spec("limited", code, restart={"on": ["signal"], "max": 1, "backoff": 0}))
    failed = gw.wait_state(plain["id"])
    assert failed["state"] == "failed" and "killed by SIGKILL" in failed["message"]
    assert failed["attempts"][0]["restart"] is None
    done = gw.wait_state(limited["id"])  # queued again after attempt 1; failed after attempt 2
    assert done["state"] == "failed" and done["attempt"] == 2
    assert done["message"] == "attempt 2: killed by SIGKILL; no restart left (1 used)"
    assert [a["restart"] is not None for a in done["attempts"]] == [True, False]
    assert [e["cause"] for e in _events(gw, limited["id"], "restart")] == ["killed by SIGKILL"]
