"""What a run has recorded: its attempts, retunes and progress metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpuwarden.core.api import AttemptList, MetricList, RetuneList
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import ON_A_RUN, errors
from gpuwarden.daemon.routes.runs import attempt_models, resolve

router = APIRouter()


@router.get(
    "/v1/runs/{ref}/attempts",
    response_model=AttemptList,
    responses=errors(*ON_A_RUN),
    summary="the run's attempts",
)
def attempts(daemon: DaemonDep, ref: str) -> AttemptList:
    return AttemptList(attempts=attempt_models(daemon, resolve(daemon, ref)))


@router.get(
    "/v1/runs/{ref}/retunes",
    response_model=RetuneList,
    responses=errors(*ON_A_RUN),
    summary="the run's retunes (from → to, verdict, evidence)",
)
def retunes(daemon: DaemonDep, ref: str) -> RetuneList:
    return RetuneList.model_validate({"retunes": daemon.runs().retunes(resolve(daemon, ref)["id"])})


@router.get(
    "/v1/runs/{ref}/metrics",
    response_model=MetricList,
    responses=errors(*ON_A_RUN),
    summary="progress metrics reported by the run",
)
def metrics(
    daemon: DaemonDep, ref: str, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000
) -> MetricList:
    return MetricList.model_validate({"metrics": daemon.runs().metrics(resolve(daemon, ref)["id"], limit)})
