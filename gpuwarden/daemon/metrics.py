"""Prometheus exposition (opt-in, TCP, read-only): GPU series under dcgm-exporter's names where
dcgm-exporter has the metric, so existing Grafana dashboards work, plus `gpuwarden_*` series for
what only gpuwarden knows (runs, retunes, lost GPUs, the host).

The collector reads the daemon's latest in-memory snapshot on each scrape; it never touches NVML
or the database, so a scrape cannot slow the sampler. The exposition passes `promtool check
metrics` except for dcgm-exporter's camelCase label `modelName`, kept so its dashboards work.
Only `GET /metrics` is served; the address is 127.0.0.1 unless `metrics.host` says otherwise.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuwarden.core.run_state import RUN_STATES, RunState
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample

MIB = 1024**2


class MetricsSource(Protocol):
    """What the exporter needs from the daemon (the daemon's in-memory latest state)."""

    def gpu_snapshot(self) -> list[tuple[GpuStatic, GpuSample | None]]: ...

    def host_snapshot(self) -> HostSample | None: ...

    def runs_snapshot(self) -> list[dict[str, Any]]:
        """Dicts with id, name, kind, state, attempts, retunes and the latest progress fields
        (samples_per_s, tokens_per_s, samples_seen, loss, mem_peak) where known."""
        ...


# (dcgm-exporter name, GpuSample attribute, scale, help). Units follow dcgm-exporter: MiB for
# framebuffer memory, W for power, mJ for energy, MHz for clocks, °C, %.
_DCGM_GAUGES: tuple[tuple[str, str, float, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "util_gpu", 1.0, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "util_mem", 1.0, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "mem_used", 1.0 / MIB, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1.0, "Enforced power limit (in W)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1.0, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1.0, "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_FAN_SPEED", "fan_pct", 1.0, "Fan speed (in %)."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons", 1.0, "Throttling reasons bitmask."),
    ("DCGM_FI_DEV_PSTATE", "pstate", 1.0, "Performance state (P0-P15)."),
)
_GPU_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
# Run progress field → (series name after gpuwarden_run_, help). Units spelled out: promtool
# refuses abbreviations such as `_s`.
_PROGRESS: dict[str, tuple[str, str]] = {
    "samples_per_s": ("samples_per_second", "Latest throughput of a running run (samples/s)."),
    "tokens_per_s": ("tokens_per_second", "Latest throughput of a running run (tokens/s)."),
    "samples_seen": ("samples_seen", "Samples processed so far."),
    "loss": ("loss", "Latest training loss."),
    "mem_peak": ("memory_peak_bytes", "Latest peak device memory of the run (bytes)."),
}
# Rates describe a running process: a run that ended (or waits) makes none, and its last rate
# exported on would read as throughput now on every dashboard summing or plotting the series.
_RATES = frozenset({"samples_per_s", "tokens_per_s"})


class GpuwardenCollector(Collector):
    def __init__(
        self,
        source: MetricsSource,
        hostname: str | None = None,
        *,
        ended_runs_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._hostname = hostname or socket.gethostname()
        self._ended_runs_s = ended_runs_s
        self._clock = clock

    def _exported(self, run: dict[str, Any]) -> bool:
        """Runs that are live, or ended within the window: Prometheus keeps what they were."""
        ended_at = run.get("ended_at")
        if not RunState(run["state"]).final or not isinstance(ended_at, int | float):
            return True
        return self._clock() - ended_at <= self._ended_runs_s

    def collect(self) -> Iterator[Metric]:
        yield from self._gpu_metrics()
        yield from self._host_metrics()
        yield from self._run_metrics()

    def _gpu_metrics(self) -> Iterator[Metric]:
        snapshot = self._source.gpu_snapshot()
        families = {
            name: GaugeMetricFamily(name, help_, labels=_GPU_LABELS) for name, _, _, help_ in _DCGM_GAUGES
        }
        fb_free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=_GPU_LABELS
        )
        # dcgm-exporter's series name has no `_total`, which a counter must have: declared untyped
        # it keeps that name for existing dashboards and still passes promtool. The counter in
        # base units is gpuwarden's own.
        energy = Metric(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "unknown"
        )
        joules = CounterMetricFamily(
            "gpuwarden_gpu_energy_joules", "Energy used by the GPU since boot (joules).", labels=_GPU_LABELS
        )
        lost = GaugeMetricFamily(
            "gpuwarden_gpu_lost", "1 while the GPU does not answer NVML.", labels=_GPU_LABELS
        )
        for static, sample in snapshot:
            labels = [str(static.index), static.uuid, f"nvidia{static.index}", static.name, self._hostname]
            lost.add_metric(labels, 1.0 if sample is not None and sample.lost else 0.0)
            if sample is None or sample.lost:
                continue
            for name, attr, scale, _ in _DCGM_GAUGES:
                value = getattr(sample, attr)
                if value is not None:
                    families[name].add_metric(labels, float(value) * scale)
            if sample.mem_used is not None and sample.mem_total is not None:
                fb_free.add_metric(labels, (sample.mem_total - sample.mem_used) / MIB)
            if sample.energy_mj is not None:
                energy.add_sample(
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                    dict(zip(_GPU_LABELS, labels, strict=True)),
                    float(sample.energy_mj),
                )
                joules.add_metric(labels, sample.energy_mj / 1000.0)
        yield from families.values()
        yield fb_free
        yield energy
        yield joules
        yield lost

    def _host_metrics(self) -> Iterator[Metric]:
        host = self._source.host_snapshot()
        if host is None:
            return
        for name, value, help_ in (
            ("gpuwarden_host_cpu_percent", host.cpu_percent, "Host CPU utilisation (in %)."),
            ("gpuwarden_host_memory_used_bytes", host.mem_used, "Host memory used (bytes)."),
            ("gpuwarden_host_memory_total_bytes", host.mem_total, "Host memory total (bytes)."),
            ("gpuwarden_host_load1", host.load1, "Host 1-minute load average."),
        ):
            if value is not None:
                g = GaugeMetricFamily(name, help_, labels=["Hostname"])
                g.add_metric([self._hostname], float(value))
                yield g

    def _run_metrics(self) -> Iterator[Metric]:
        runs = [run for run in self._source.runs_snapshot() if self._exported(run)]
        # Hostname as on the GPU series, so one dashboard variable selects a machine's everything.
        labels = ["run", "name", "Hostname"]
        state = GaugeMetricFamily(
            "gpuwarden_run_state", "1 for the run's current state.", labels=[*labels, "kind", "state"]
        )
        attempts = GaugeMetricFamily("gpuwarden_run_attempts", "Attempts started.", labels=labels)
        retunes = CounterMetricFamily("gpuwarden_run_retunes", "Retunes applied.", labels=labels)
        progress = {
            key: GaugeMetricFamily(f"gpuwarden_run_{name}", help_, labels=labels)
            for key, (name, help_) in _PROGRESS.items()
        }
        for run in runs:
            ident = [str(run["id"]), str(run.get("name") or ""), self._hostname]
            for s in RUN_STATES:
                state.add_metric(
                    [*ident, str(run.get("kind") or ""), s], 1.0 if run.get("state") == s else 0.0
                )
            attempts.add_metric(ident, float(run.get("attempts") or 0))
            retunes.add_metric(ident, float(run.get("retunes") or 0))
            running = run.get("state") == RunState.RUNNING
            for key, family in progress.items():
                value = run.get(key)
                if isinstance(value, int | float) and (running or key not in _RATES):
                    family.add_metric(ident, float(value))
        yield state
        yield attempts
        yield retunes
        yield from progress.values()


@dataclass
class MetricsServer:
    """A running exporter; `close()` stops it (the daemon calls it on shutdown)."""

    server: WSGIServer
    thread: threading.Thread
    host: str
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def only_metrics_path(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app` at GET/HEAD /metrics; 404 for every other path, 405 for other methods."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: this exporter serves /metrics only\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed: GET /metrics\n"]
        if environ["REQUEST_METHOD"] == "HEAD":
            # The client library's app knows GET only; HEAD is its headers without the body.
            body = app({**environ, "REQUEST_METHOD": "GET"}, start_response)
            if hasattr(body, "close"):
                body.close()
            return []
        return app(environ, start_response)

    return wrapped


class _IPv6Server(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: scrapes come every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def start_metrics_server(
    source: MetricsSource, host: str, port: int, ended_runs_s: float = 3600.0
) -> MetricsServer:
    """Serve GET /metrics on host:port from a background thread (a thread per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuwardenCollector(source, ended_runs_s=ended_runs_s))
    server_class = _IPv6Server if ":" in host else ThreadingWSGIServer
    server = make_server(
        host, port, only_metrics_path(make_wsgi_app(registry)), server_class, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server=server, thread=thread, host=host, port=server.server_port)
