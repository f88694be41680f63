"""Runs: list, submit, read, edit, delete, and the actions on one (stop, resume, tune)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from gpuwarden.core import run_views
from gpuwarden.core.api import (
    Deleted,
    EditRequest,
    RunDetail,
    RunList,
    RunSummary,
    StopRequest,
    SubmitRequest,
)
from gpuwarden.core.api.runs import Attempt
from gpuwarden.core.config.resolve import relative_paths, resolve_relative_paths
from gpuwarden.core.config.spec import RunSpec, spec_from_document, spec_from_mapping
from gpuwarden.core.config.yamlsource import parse_yaml
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.core.submission import DEADLINE_HEADER, KEY_HEADER, KEY_PATTERN, Submission
from gpuwarden.daemon.routes.daemon_view import DaemonDep, DaemonView, RunRow
from gpuwarden.daemon.routes.responses import ON_A_RUN, WITH_A_BODY, WRITES, errors

router = APIRouter()


def run_detail(daemon: DaemonView, run: RunRow) -> RunDetail:
    """A run whole (`core/run_views.py`), with the pid of the program it runs now."""
    return run_views.run_detail(daemon.runs(), daemon.telemetry_reader(), run, _live_program(daemon, run))


def attempt_models(daemon: DaemonView, run: RunRow) -> list[Attempt]:
    return run_views.attempt_models(daemon.runs(), run, _live_program(daemon, run))


def _live_program(daemon: DaemonView, run: RunRow) -> int | None:
    return daemon.supervisor.program_of(run["id"]) if run["state"] == RunState.RUNNING else None


def resolve(daemon: DaemonView, ref: str) -> RunRow:
    """The run `ref` names (id, name or unique prefix); UserError not_found / ambiguous."""
    return daemon.runs().resolve(ref)


@router.get("/v1/runs", response_model=RunList, responses=errors(422), summary="runs, newest first")
def list_runs(
    daemon: DaemonDep,
    state: Annotated[list[RunState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> RunList:
    rows = daemon.runs().list_runs(states=state, limit=limit)
    return RunList(runs=[RunSummary.from_row(r) for r in rows])


SubmitKey = Annotated[
    str | None,
    Header(
        alias=KEY_HEADER,
        pattern=KEY_PATTERN,
        description="a fresh random key per submit: the same submit sent again with it (after a "
        "timeout or a dropped connection) answers the run the first one queued (200), never a second",
    ),
]
SubmitDeadline = Annotated[
    float | None,
    Header(
        alias=DEADLINE_HEADER,
        gt=0,
        description="when the client stops waiting for the answer (seconds since the epoch): a "
        "submit not queued by then is not queued at all (503 `deadline`)",
    ),
]
_REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"model": RunDetail, "description": "the run an earlier submit with this Idempotency-Key queued"}
}


@router.post(
    "/v1/runs",
    status_code=201,
    response_model=RunDetail,
    responses={**_REPLAYED, **errors(WITH_A_BODY, 400, 404, 409, 422, 503, 507)},
    summary="submit a run spec",
)
def submit(
    daemon: DaemonDep,
    body: SubmitRequest,
    response: Response,
    key: SubmitKey = None,
    deadline: SubmitDeadline = None,
) -> RunDetail:
    submission = Submission.of(body.model_dump_json(), key, deadline)
    if key is not None and (earlier := daemon.runs().submitted_as(key)) is not None:
        earlier.check_same(submission)
        response.status_code = 200
        return run_detail(daemon, resolve(daemon, earlier.run_id))
    label = body.label or "spec"
    if body.spec_yaml is None:
        assert body.spec is not None  # the request model allows exactly one of the two
        return _submit(daemon, body, spec_from_mapping(body.spec, label=label), label, submission)
    # Both readers bound size, depth and alias expansion before anything walks the document.
    document = parse_yaml(body.spec_yaml, label)
    # Checks after validation (placeholders, inputs, GPUs) name a key; the user reads file:line.
    with document.locating(RunSpec.model_fields):
        return _submit(daemon, body, spec_from_document(document), label, submission)


def _submit(
    daemon: DaemonView, body: SubmitRequest, spec: RunSpec, label: str, submission: Submission
) -> RunDetail:
    if body.base_dir is not None:
        spec = resolve_relative_paths(spec, Path(body.base_dir))
    elif relative := relative_paths(spec):
        # Against the daemon's own working folder they would point wherever `gpuwarden up` ran.
        are = "is a relative path" if len(relative) == 1 else "are relative paths"
        raise UserError(
            f"{label}: {', '.join(relative)} {are} and the request names no base_dir — send "
            "base_dir (the folder they start from) or absolute paths"
        )
    run = daemon.supervisor.submit(
        spec,
        submitted_text=body.spec_yaml,
        label=label,
        check_inputs=body.check_inputs,
        environment=body.environment,
        submission=submission,
    )
    return run_detail(daemon, run)


@router.get(
    "/v1/runs/{ref}",
    response_model=RunDetail,
    responses=errors(*ON_A_RUN),
    summary="one run: state, spec, attempts, retunes, report",
)
def get_run(daemon: DaemonDep, ref: str) -> RunDetail:
    return run_detail(daemon, resolve(daemon, ref))


@router.patch(
    "/v1/runs/{ref}",
    response_model=RunDetail,
    responses=errors(WITH_A_BODY, *ON_A_RUN, 409, WRITES),
    summary="edit a run that is not running: name, some knobs, resources, dotted spec keys",
)
def edit_run(daemon: DaemonDep, ref: str, body: EditRequest) -> RunDetail:
    run = resolve(daemon, ref)
    changes = body.model_dump(exclude_none=True)
    return run_detail(daemon, daemon.supervisor.edit_run(run["id"], changes))


@router.delete(
    "/v1/runs/{ref}",
    response_model=Deleted,
    responses=errors(*ON_A_RUN, 409, WRITES),
    summary="forget a finished run and remove its directory",
)
def delete_run(daemon: DaemonDep, ref: str) -> Deleted:
    run = resolve(daemon, ref)
    same_name = daemon.runs().ids_named(run["name"]) if not run["id"].startswith(ref) else []
    if len(same_name) > 1:
        # Reading the newest run of a name is a convenience; forgetting one by it is not.
        of = f" of '{run['name']}'" if ref != run["name"] else ""
        raise UserError(
            f"'{ref}' names {len(same_name)} runs{of} ({', '.join(same_name[:5])}, newest first) — "
            "give the id of the one to remove",
            code="ambiguous",
        )
    daemon.supervisor.delete_run(run["id"])
    return Deleted(deleted=run["id"])


@router.post(
    "/v1/runs/{ref}/stop",
    response_model=RunDetail,
    responses=errors(WITH_A_BODY, *ON_A_RUN, 409, WRITES),
    summary="SIGTERM the run's process group, SIGKILL after the grace period",
)
def stop_run(daemon: DaemonDep, ref: str, body: StopRequest | None = None) -> RunDetail:
    run = resolve(daemon, ref)
    grace = body.grace_seconds if body is not None else None
    return run_detail(daemon, daemon.supervisor.stop_run(run["id"], grace))


@router.post(
    "/v1/runs/{ref}/resume",
    response_model=RunDetail,
    responses=errors(*ON_A_RUN, 409, WRITES),
    summary="queue a new attempt of a failed, stopped or interrupted run",
)
def resume_run(daemon: DaemonDep, ref: str) -> RunDetail:
    run = resolve(daemon, ref)
    return run_detail(daemon, daemon.supervisor.resume_run(run["id"]))


@router.post(
    "/v1/runs/{ref}/tune",
    response_model=RunDetail,
    responses=errors(*ON_A_RUN, 409, WRITES),
    summary="probe for the fastest micro-batch before the run's next attempt",
)
def tune_run(daemon: DaemonDep, ref: str) -> RunDetail:
    run = resolve(daemon, ref)
    return run_detail(daemon, daemon.supervisor.tune_run(run["id"]))
