"""The daemon's HTTP API as types: what each operation takes and answers.

One set of pydantic models shared by the daemon (response models, so the OpenAPI description
documents every answer), the client (`ApiClient` returns them) and the dashboard (its backends
produce them). Headless: pydantic and the core's own records only.
"""

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
    HostReading,
    LiveProcess,
    LiveProcesses,
    MetricNames,
    ProcessReads,
    SampleBody,
    ShutdownResult,
    TerminateResult,
)

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
    "HostReading",
    "LiveProcess",
    "LiveProcesses",
    "LogChunk",
    "LogSlice",
    "MetricList",
    "MetricNames",
    "ProcessReads",
    "RankStatus",
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
