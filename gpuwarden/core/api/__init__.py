"""The daemon's HTTP API as types: what each operation takes and answers.

One set of pydantic models shared by the daemon (response models, so the OpenAPI description
documents every answer), the client (`ApiClient` returns them) and the dashboard (its backends
produce them). Headless: pydantic and the core's own records only.

Importing this package imports none of its modules: a name is loaded from its module when first
asked for, so `gpuwarden ps` builds the run list's models and not the other forty.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.core.api.errors import ErrorBody, ErrorDetail
    from gpuwarden.core.api.requests import EditRequest, StopRequest, SubmitRequest
    from gpuwarden.core.api.runs import (
        Attempt,
        AttemptEnergyReading,
        AttemptList,
        Deleted,
        EventsPage,
        LogChunk,
        LogSlice,
        MetricList,
        RankStatus,
        Retune,
        RetuneList,
        RunDetail,
        RunEnergy,
        RunEvent,
        RunList,
        RunMetric,
        RunSummary,
    )
    from gpuwarden.core.api.telemetry import (
        GpuInfo,
        GpuList,
        Health,
        HistoryAnswer,
        HostProcesses,
        HostReading,
        LiveProcess,
        LiveProcesses,
        MetricNames,
        ProcessReads,
        RankedProcess,
        SampleBody,
        ShutdownResult,
        TerminateResult,
    )

_MODULES = {
    "Attempt": "runs",
    "AttemptEnergyReading": "runs",
    "AttemptList": "runs",
    "Deleted": "runs",
    "EditRequest": "requests",
    "ErrorBody": "errors",
    "ErrorDetail": "errors",
    "EventsPage": "runs",
    "GpuInfo": "telemetry",
    "GpuList": "telemetry",
    "Health": "telemetry",
    "HistoryAnswer": "telemetry",
    "HostProcesses": "telemetry",
    "HostReading": "telemetry",
    "LiveProcess": "telemetry",
    "LiveProcesses": "telemetry",
    "LogChunk": "runs",
    "LogSlice": "runs",
    "MetricList": "runs",
    "MetricNames": "telemetry",
    "ProcessReads": "telemetry",
    "RankedProcess": "telemetry",
    "RankStatus": "runs",
    "Retune": "runs",
    "RetuneList": "runs",
    "RunDetail": "runs",
    "RunEnergy": "runs",
    "RunEvent": "runs",
    "RunList": "runs",
    "RunMetric": "runs",
    "RunSummary": "runs",
    "SampleBody": "telemetry",
    "ShutdownResult": "telemetry",
    "StopRequest": "requests",
    "SubmitRequest": "requests",
    "TerminateResult": "telemetry",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "Attempt",
    "AttemptEnergyReading",
    "AttemptList",
    "Deleted",
    "EditRequest",
    "ErrorBody",
    "ErrorDetail",
    "EventsPage",
    "GpuInfo",
    "GpuList",
    "Health",
    "HistoryAnswer",
    "HostProcesses",
    "HostReading",
    "LiveProcess",
    "LiveProcesses",
    "LogChunk",
    "LogSlice",
    "MetricList",
    "MetricNames",
    "ProcessReads",
    "RankStatus",
    "RankedProcess",
    "Retune",
    "RetuneList",
    "RunDetail",
    "RunEnergy",
    "RunEvent",
    "RunList",
    "RunMetric",
    "RunSummary",
    "SampleBody",
    "ShutdownResult",
    "StopRequest",
    "SubmitRequest",
    "TerminateResult",
]
