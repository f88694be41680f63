"""Metric history of the GPUs or the host over a window, and the metric names it accepts."""

from __future__ import annotations

import re
import time
from typing import Annotated

from fastapi import APIRouter, Query

from gpuwarden.core.api import HistoryAnswer, MetricNames
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GPU_METRICS, HOST_METRICS
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import errors

# ASCII digits and blanks only, so the OpenAPI pattern (an ECMA regex) says exactly the same.
WINDOW_PATTERN = r"^[ \t]*([0-9]+(\.[0-9]+)?)[ \t]*([smhdw]?)[ \t]*$"
_WINDOW_RE = re.compile(WINDOW_PATTERN)
_WINDOW_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Ten years: far beyond any retention, and short of windows that start before 1970.
MAX_WINDOW_S = 3650 * 86400.0
DEFAULT_GPU_METRICS = ["util_gpu", "mem_used"]
# Every name `metric` may hold, in the description; which of them the GPUs or the host have is
# the route's to say (one parameter cannot be tied to another in OpenAPI).
METRIC_NAMES = sorted({*GPU_METRICS, *HOST_METRICS})
DEFAULT_HOST_METRICS = ["cpu_percent", "mem_used"]

router = APIRouter()


def parse_window(text: str) -> float:
    """'90s', '15m', '1h', '7d', '2w' or plain seconds → seconds; UserError otherwise."""
    match = _WINDOW_RE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"window {text!r}: use a positive number with s, m, h, d or w, e.g. 1h")
    seconds = float(match.group(1)) * _WINDOW_UNITS[match.group(3)]
    if seconds > MAX_WINDOW_S:
        raise UserError(f"window {text!r} is too long: at most {MAX_WINDOW_S // 86400:.0f}d")
    return seconds


@router.get(
    "/v1/history",
    response_model=HistoryAnswer,
    responses=errors(400, 404, 422),
    summary="metric series over a time window, in at most `points` buckets",
)
def history(
    daemon: DaemonDep,
    window: Annotated[
        str,
        Query(
            max_length=32, description="e.g. 15m, 1h, 24h, 7d", json_schema_extra={"pattern": WINDOW_PATTERN}
        ),
    ] = "1h",
    metric: Annotated[
        list[str] | None,
        Query(
            max_length=64,
            description="metric names (GET /v1/metrics-names lists the GPU's and the host's)",
            json_schema_extra={"items": {"type": "string", "enum": METRIC_NAMES}},
        ),
    ] = None,
    gpu: Annotated[list[str] | None, Query(max_length=64, description="GPU UUIDs (default: all)")] = None,
    points: Annotated[int, Query(ge=1, le=5000)] = 300,
    end: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    host: bool = False,
) -> HistoryAnswer:
    span = parse_window(window)
    stop = end if end is not None else time.time()
    store = daemon.telemetry_reader()
    if host:
        metrics = metric or DEFAULT_HOST_METRICS
        bad = [m for m in metrics if m not in HOST_METRICS]
        if bad:
            raise UserError(f"unknown host metric {bad[0]} — choose from: {', '.join(HOST_METRICS)}")
        answer = store.host_history(metrics, stop - span, stop, points)
    else:
        answer = store.history(gpu, metric or DEFAULT_GPU_METRICS, stop - span, stop, points)
    return HistoryAnswer.model_validate(answer, from_attributes=True)


@router.get(
    "/v1/metrics-names",
    response_model=MetricNames,
    responses=errors(),
    summary="metric names history accepts",
)
def metric_names() -> MetricNames:
    return MetricNames(gpu=list(GPU_METRICS), host=list(HOST_METRICS))
