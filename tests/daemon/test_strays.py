"""Terminating stray GPU processes (`gpuwarden clean`, the dashboard's `k`): real processes,
real signals; runs and other users' processes are refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GpuProcess
from gpuwarden.daemon.strays import terminate_gpu_process
from gpuwarden.daemon.supervise import Conflict
from tests.daemon.conftest import DaemonHandle

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    yield proc
    proc.kill()
    proc.wait()


def _on_gpu(pid: int) -> list[GpuProcess]:
    return [GpuProcess(ts=0.0, uuid="GPU-a", pid=pid, used_memory=1 << 30, name="python")]


def test_sigterm_ends_a_stray_process(child: subprocess.Popen[str]) -> None:
    out = terminate_gpu_process(child.pid, _on_gpu(child.pid), {}, 5.0, time.time)
    assert out.signal == "SIGTERM" and out.pid == child.pid
    assert child.wait(timeout=5) == -15


def test_sigkill_after_the_grace_period() -> None:
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        terminate_gpu_process(proc.pid, _on_gpu(proc.pid), {}, 0.5, time.time)
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait()


def test_refuses_what_is_not_a_stray_of_yours(child: subprocess.Popen[str]) -> None:
    with pytest.raises(UserError, match="holds no GPU memory"):
        terminate_gpu_process(child.pid, [], {}, 1.0, time.time)
    with pytest.raises(Conflict, match="part of run r1: stop the run instead"):
        terminate_gpu_process(child.pid, _on_gpu(child.pid), {os.getpgid(child.pid): "r1"}, 1.0, time.time)
    assert child.poll() is None  # untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_refuses_another_users_process() -> None:
    def become_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    proc = subprocess.Popen(["/bin/sleep", "60"], preexec_fn=become_nobody)
    try:
        with pytest.raises(UserError, match="is not yours"):
            terminate_gpu_process(proc.pid, _on_gpu(proc.pid), {}, 1.0, time.time)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_api_and_cli(gw: DaemonHandle) -> None:
    import httpx

    transport = httpx.HTTPTransport(uds=str(gw.socket))
    with httpx.Client(transport=transport, base_url="http://gw") as http:
        r = http.post("/v1/processes/999999/terminate")
        assert r.status_code == 404
        assert r.json()["error"]["message"].startswith("process 999999 holds no GPU memory")
        r = http.post("/v1/processes/abc/terminate")
        assert r.status_code == 422
    clean = gw.cli("clean", "--yes")
    assert clean.returncode == 0 and "no stray GPU processes" in clean.stdout
    assert gw.cli_json("clean") == {"terminated": []}
    assert gw.cli("clean", "--gpu", "1", "--yes").returncode == 0
    nowhere = gw.cli("clean", "--gpu", "7", "--yes")  # the daemon's two fake GPUs are 0 and 1
    assert nowhere.returncode == 2 and nowhere.stderr.count("\n") == 1, nowhere.stderr
    assert nowhere.stderr.startswith("gpuwarden: --gpu 7: matches no GPU — use an index or UUID from: 0 (")


def test_tune_a_command_run_is_refused_and_a_running_one_conflicts(gw: DaemonHandle) -> None:
    spec = {
        "name": "sleeper",
        "kind": "command",
        "command": {"argv": [sys.executable, "-c", "import time; time.sleep(30)"]},
        "resources": {"gpus": 1},
    }
    run = gw.submit(spec)
    gw.wait_state(run["id"], ("running",))
    with gw.client() as client:
        with pytest.raises(UserError, match="stop it first"):
            client.tune(run["id"])
        client.stop(run["id"], grace_seconds=0.5)
    gw.wait_state(run["id"])
    with (
        gw.client() as client,
        pytest.raises(UserError, match=r"cannot probe this program — name the knob that is the micro-batch"),
    ):
        client.tune(run["id"])


@pytest.mark.slow
def test_tune_a_stopped_training_run_resumes_it_tuned(daemon_factory: object) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})  # type: ignore[operator]
    spec = {
        "name": "to-tune",
        "kind": "train",
        "env": {"OMP_NUM_THREADS": "1"},
        "resources": {"gpus": 0},
        "train": {
            "task": "image",
            "batch_size": 1,
            "grad_accum_steps": 2,
            "max_steps": 2,
            "log_interval": 1,
            "image": {"base_channels": 8, "num_blocks": 2, "patch_size": 32, "synthetic_samples": 64},
        },
    }
    run = gw.submit(spec)
    with gw.client() as client:
        client.stop(run["id"], grace_seconds=1)
    gw.wait_state(run["id"], timeout=60)
    with gw.client() as client:
        assert client.tune(run["id"]).state in ("queued", "starting")
    final = gw.wait_state(run["id"], ("succeeded", "failed"), timeout=300)
    assert final["state"] == "succeeded", final["message"]
    with gw.client() as client:
        assert any(e.type == "autotuned" for e in client.events(run["id"]).events)
        spec_now = client.run(run["id"]).spec
    t = spec_now["train"]
    assert t["batch_size"] * t["grad_accum_steps"] == 2 and spec_now["autotune"] is False
