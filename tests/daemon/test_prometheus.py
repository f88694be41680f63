"""The Prometheus exporter of a real daemon, checked by Prometheus's own linter (`promtool check
metrics`) with one and eight fake GPUs and a finished run: the only finding allowed is
dcgm-exporter's camelCase label `modelName`, which its dashboards need."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.conftest import command_spec, wait_for

PROMTOOL = shutil.which("promtool")
CAMEL_LABEL_FINDING = "label names should be written in 'snake_case' not 'camelCase'"
# dcgm-exporter's label names; `modelName` is the one promtool calls camelCase.
DCGM_CAMEL_LABELS = {"modelName"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, gpus: int, deadline_s: float = 20.0) -> str:
    """/metrics once every GPU has a sample (the first tick is taken before the server starts)."""
    deadline = time.monotonic() + deadline_s
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        if text.count("DCGM_FI_DEV_GPU_UTIL{") == gpus and "gpuwarden_run_state{" in text:
            return text
        assert time.monotonic() < deadline, text[-2000:]
        time.sleep(0.1)


def _metrics_daemon(daemon_factory: Any, scenario: str, **settings: str) -> tuple[Any, int]:
    port = _free_port()
    env = {f"GPUWARDEN_METRICS__{key.upper()}": value for key, value in settings.items()}
    gw = daemon_factory(
        {
            "GPUWARDEN_FAKE_NVML": scenario,
            "GPUWARDEN_METRICS__ENABLED": "true",
            "GPUWARDEN_METRICS__PORT": str(port),
            **env,
        }
    )
    return gw, port


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian/Ubuntu: apt-get install prometheus)"
)
@pytest.mark.parametrize(("scenario", "gpus"), [("h100", 1), ("h100x8", 8)])
def test_promtool_finds_nothing_but_dcgm_label_names(daemon_factory: Any, scenario: str, gpus: int) -> None:
    gw, port = _metrics_daemon(daemon_factory, scenario)
    run = gw.submit(command_spec("metrics-run", "print('done')"))
    assert gw.wait_state(run["id"])["state"] == "succeeded"
    text = _scrape(port, gpus)

    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    findings = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    assert [f for f in findings if CAMEL_LABEL_FINDING not in f] == []

    families = {f.name: f for f in text_string_to_metric_families(text)}
    camel = {
        label
        for f in families.values()
        for s in f.samples
        for label in s.labels
        if re.search("[a-z][A-Z]", label)
    }
    assert camel == DCGM_CAMEL_LABELS
    # dcgm-exporter's series names stay for existing dashboards; the energy counter in joules is ours
    energy = families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.type == "unknown" and len(energy.samples) == gpus
    joules = families["gpuwarden_gpu_energy_joules"]
    assert joules.type == "counter" and {s.name for s in joules.samples} == {
        "gpuwarden_gpu_energy_joules_total"
    }
    states = {s.labels["state"]: s.value for s in families["gpuwarden_run_state"].samples}
    assert states["succeeded"] == 1


def test_only_get_metrics_is_served_on_loopback(daemon_factory: Any) -> None:
    gw, port = _metrics_daemon(daemon_factory, "h100")
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/metrics?x=1", timeout=5).status_code == 200
    head = httpx.head(f"{base}/metrics", timeout=5)  # what the refusal's Allow header offers
    assert head.status_code == 200 and head.content == b""
    for path in ("/", "/favicon.ico", "/metrics/", "/v1/health", "/anything"):
        assert httpx.get(base + path, timeout=5).status_code == 404, path
    refused = httpx.post(f"{base}/metrics", timeout=5)
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    # Bound to the loopback address only (the default metrics.host).
    assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in _daemon_log(gw)


def _daemon_log(gw: Any) -> str:
    text: str = gw.log.read_text()
    return text


def _run_series(port: int, run_id: str) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("run") == run_id and s.name != "gpuwarden_run_state"
    }


def test_a_runs_throughput_is_exported_while_it_runs_only(daemon_factory: Any, tmp_path: Path) -> None:
    gw, port = _metrics_daemon(daemon_factory, "h100")
    release = tmp_path / "release"
    code = f"""
        import os, time
        from gpuwarden import sdk
        sdk.progress(1, 10, samples_per_s=5.0, tokens_per_s=50.0, batch_size=10)
        while not os.path.exists({str(release)!r}):
            time.sleep(0.05)
    """
    run = gw.submit(command_spec("rates", code, resources={"gpus": 0}))
    rate = wait_for(
        lambda: _run_series(port, run["id"]).get("gpuwarden_run_samples_per_second"),
        "the running run's throughput on /metrics",
    )
    assert rate == 5.0
    assert _run_series(port, run["id"])["gpuwarden_run_tokens_per_second"] == 50.0

    release.touch()
    assert gw.wait_state(run["id"])["state"] == "succeeded"
    ended = _run_series(port, run["id"])
    # what the run did stays; a rate it no longer makes does not read as throughput now
    assert ended["gpuwarden_run_samples_seen"] == 10
    assert "gpuwarden_run_samples_per_second" not in ended
    assert "gpuwarden_run_tokens_per_second" not in ended


def test_runs_that_ended_leave_the_exposition_after_the_configured_window(daemon_factory: Any) -> None:
    # 0 minutes: only live runs are exported, so the series count stays bounded however many
    # runs the daemon has kept; what an ended run was stays in Prometheus's own history.
    gw, port = _metrics_daemon(daemon_factory, "h100", ended_runs_minutes="0")
    done = gw.submit(command_spec("done", "pass", resources={"gpus": 0}))
    assert gw.wait_state(done["id"])["state"] == "succeeded"
    waiting = gw.submit(command_spec("waiting", "pass", resources={"gpus": 1, "min_free_memory": "900GiB"}))

    def scraped_with_the_queued_run() -> str:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return text if waiting["id"] in text else ""

    text = wait_for(scraped_with_the_queued_run, "the queued run on /metrics")
    assert f'run="{done["id"]}"' not in text
    states = {
        s.labels["state"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpuwarden_run_state" and s.labels["run"] == waiting["id"]
    }
    assert states["queued"] == 1.0
