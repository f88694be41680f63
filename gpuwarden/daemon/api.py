"""The HTTP+JSON API under /v1 (FastAPI): GPUs, history, processes, host, runs, logs, live stream.

Errors are always `{"error": {"code": ..., "message": "one line"}}` with a 4xx status for anything
a client can cause; a 500 means a daemon bug.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuwarden import __version__
from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import KnobValue, RunSpec, parse_spec, spec_from_mapping
from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.core.report.energy import stored_energy
from gpuwarden.core.run_state import FINAL_STATES, RunState
from gpuwarden.core.telemetry.types import GPU_METRICS, HOST_METRICS
from gpuwarden.daemon.strays import terminate_gpu_process
from gpuwarden.daemon.stream import FRAME_TYPES
from gpuwarden.daemon.supervisor import owner_of, run_summary

if TYPE_CHECKING:
    from gpuwarden.daemon.app import Daemon

log = logging.getLogger("gpuwarden.daemon.api")

API_VERSION = "1.0"
MAX_LOG_CHUNK = 1 << 20
MAX_WAIT_S = 30.0
# Stored process reads one request may return (a day of 5-second scans of ~5 processes).
PROCESS_ROWS_MAX = 100_000
_STATUS_BY_CODE = {
    "not_found": 404,
    "conflict": 409,
    "already_running": 409,
    "ambiguous": 400,
    "invalid_config": 422,
    "invalid_request": 422,
}
_WINDOW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_WINDOW_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Ten years: far beyond any retention, and short of windows that start before 1970.
MAX_WINDOW_S = 3650 * 86400.0


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The one error shape every failure uses."""
    return {"error": {"code": code, "message": message, **extra}}


def one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "error"


def parse_window(text: str) -> float:
    """'90s', '15m', '1h', '7d', '2w' or plain seconds → seconds; UserError otherwise."""
    match = _WINDOW_RE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"window {text!r}: use a positive number with s, m, h, d or w, e.g. 1h")
    seconds = float(match.group(1)) * _WINDOW_UNITS[match.group(2)]
    if seconds > MAX_WINDOW_S:
        raise UserError(f"window {text!r} is too long: at most {MAX_WINDOW_S // 86400:.0f}d")
    return seconds


class SubmitRequest(BaseModel):
    """A run spec as JSON (`spec`) or as YAML text (`spec_yaml`, relative paths against `base_dir`)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] | None = None
    spec_yaml: str | None = Field(None, max_length=1_000_000)
    base_dir: str | None = Field(
        None, description="absolute directory that relative paths in the spec start from"
    )
    label: str | None = Field(None, max_length=4096, description="file name used in error messages")
    check_inputs: bool = Field(
        True, description="refuse a spec whose model, data or cwd is missing (false: a run creates them)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> SubmitRequest:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of `spec` (JSON) or `spec_yaml` (text)")
        if self.base_dir is not None and not os.path.isabs(self.base_dir):
            raise ValueError("base_dir must be an absolute path")
        return self


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: float | None = Field(
        None, ge=0, le=3600, description="SIGTERM → SIGKILL; default from settings"
    )


class EditRequest(BaseModel):
    """Fields of a queued run that may change; each replaces the spec's section whole."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    knobs: dict[str, KnobValue] | None = None
    resources: dict[str, Any] | None = None
    set: dict[str, KnobValue] | None = Field(
        None, description='dotted spec keys to set, e.g. {"train.batch_size": 4, "train.grad_accum_steps": 8}'
    )


def _status_for(exc: UserError) -> int:
    return _STATUS_BY_CODE.get(exc.code, 400)


def _validation_message(exc: RequestValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        msg = str(err.get("msg", "invalid")).replace("Value error, ", "")
        if loc == "request" and err.get("type") in ("model_attributes_type", "dict_type"):
            msg = "the body must be a JSON object (the fields are in /v1/openapi.json)"
        elif err.get("type") == "json_invalid":
            # pydantic puts the character offset in the location: say it in words instead.
            at = err.get("loc", ("", ""))[-1]
            why = err.get("ctx", {}).get("error", msg)
            loc, msg = "request", f"the body is not valid JSON ({why} at character {at})"
        problems.append(f"{loc}: {msg}")
    return one_line("; ".join(problems))


def create_app(daemon: Daemon) -> FastAPI:
    """The FastAPI application bound to a running daemon."""
    app = FastAPI(
        title="gpuwarden",
        version=__version__,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )

    # -- errors ------------------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", _validation_message(exc)), status_code=422)

    @app.exception_handler(UserError)
    async def _user_error(request: Request, exc: UserError) -> JSONResponse:
        extra = {"problems": exc.problems} if isinstance(exc, ConfigError) else {}
        return JSONResponse(error_body(exc.code, one_line(str(exc)), **extra), status_code=_status_for(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = one_line(str(exc.detail))
        if exc.status_code == 400 and message == "There was an error parsing the body":
            # FastAPI's words for a body that is not UTF-8 JSON at all.
            code = "bad_input"
            message = "the body is not UTF-8 JSON: send a JSON object (see /v1/openapi.json)"
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(
            error_body("internal", f"daemon error: {type(exc).__name__}: {exc}"), status_code=500
        )

    # -- helpers -------------------------------------------------------------------------------------

    def resolve(ref: str) -> dict[str, Any]:
        return daemon.runs().resolve(ref)

    def detail(run: dict[str, Any]) -> dict[str, Any]:
        store = daemon.runs()
        spec = run["spec"]
        train = spec.get("train") if run["kind"] == "train" else None
        effective = (
            int(train["batch_size"]) * int(train["grad_accum_steps"]) * int(train["world_size"])
            if train
            else None
        )
        report_path = Path(run["run_dir"]) / "report.json"
        report: Any = None
        if report_path.exists():
            try:
                report = json.loads(report_path.read_text())
            except (OSError, ValueError) as exc:
                report = {"unreadable": str(exc)}
        return {
            **run_summary(run),
            "run_dir": run["run_dir"],
            "stop_requested": run["stop_requested"],
            "spec": spec,
            "submitted_spec": run["submitted_spec"],
            "attempts": store.attempts(run["id"]),
            "retunes": store.retunes(run["id"]),
            "effective_batch": effective,
            "report": report,
            # J/sample and samples/kWh of the run and of each attempt (None without a counter).
            "energy": stored_energy(store, daemon.telemetry_reader(), run["id"], time.time()),
        }

    # -- health and telemetry ------------------------------------------------------------------------

    @app.get("/v1/health", summary="daemon version, API version, pid, uptime, GPU status")
    def health() -> dict[str, Any]:
        return {
            "name": "gpuwarden",
            "version": __version__,
            "api_version": API_VERSION,
            "pid": os.getpid(),
            "uptime_s": round(daemon.uptime, 3),
            "gpu_status": daemon.gpu_status,
            "db": str(daemon.paths.db),
            "socket": str(daemon.paths.socket),
            "active_runs": len(daemon.supervisor.active),
            "stream_clients": daemon.broadcaster.client_count,
        }

    @app.get("/v1/gpus", summary="GPUs: static facts and the latest sample")
    def gpus() -> dict[str, Any]:
        tick = daemon.latest_tick
        latest = {s.uuid: s.to_dict() for s in tick.gpus} if tick else {}
        statics = daemon.sampler.gpus() if daemon.sampler is not None else []
        return {
            "status": daemon.gpu_status,
            "ts": tick.ts if tick else None,
            "gpus": [{**g.to_dict(), "sample": latest.get(g.uuid)} for g in statics],
        }

    @app.get("/v1/host", summary="the latest host sample")
    def host() -> dict[str, Any]:
        tick = daemon.latest_tick
        return {"host": tick.host.to_dict() if tick and tick.host else None}

    @app.get(
        "/v1/processes",
        summary="processes on the GPUs now, with the run each belongs to; with `since`, every stored "
        "process read in [since, until) instead (oldest first, raw retention)",
    )
    def processes(
        since: Annotated[float | None, Query(ge=0, le=1e11, description="unix seconds")] = None,
        until: Annotated[float | None, Query(ge=0, le=1e11, description="unix seconds")] = None,
        gpu: Annotated[str | None, Query(max_length=128, description="one GPU UUID (default: all)")] = None,
        limit: Annotated[int, Query(ge=1, le=PROCESS_ROWS_MAX)] = PROCESS_ROWS_MAX,
    ) -> dict[str, Any]:
        if since is None:
            if until is not None or gpu is not None:
                raise UserError("until and gpu select stored process reads: give since as well")
            rows = daemon.latest_processes
            groups = daemon.supervisor.pid_owners()
            return {"processes": [{**p.to_dict(), "run_id": owner_of(p.pid, groups)} for p in rows]}
        if until is not None and until <= since:
            raise UserError(f"empty window: until ({until}) must be after since ({since})")
        store = daemon.telemetry_reader()
        # One row more than asked tells whether the answer was cut.
        stored = store.processes(latest_only=False, uuid=gpu, since=since, until=until, limit=limit + 1)
        return {
            "processes": [p.to_dict() for p in stored[:limit]],
            "truncated": len(stored) > limit,
            # Reads before this were dropped by retention (None: no read stored yet).
            "kept_since": store.oldest_process_read(),
        }

    @app.post(
        "/v1/processes/{pid}/terminate",
        summary="SIGTERM a stray GPU process of yours (not part of a run), SIGKILL after the grace period",
    )
    def terminate_process(pid: int, body: StopRequest | None = None) -> dict[str, Any]:
        grace = body.grace_seconds if body is not None and body.grace_seconds is not None else 5.0
        return terminate_gpu_process(
            pid, daemon.latest_processes, daemon.supervisor.pid_owners(), grace, daemon.supervisor.clock
        )

    @app.get("/v1/history", summary="metric series over a time window, in at most `points` buckets")
    def history(
        window: Annotated[str, Query(max_length=32, description="e.g. 15m, 1h, 24h, 7d")] = "1h",
        metric: Annotated[list[str] | None, Query(max_length=64)] = None,
        gpu: Annotated[list[str] | None, Query(max_length=64, description="GPU UUIDs (default: all)")] = None,
        points: Annotated[int, Query(ge=1, le=5000)] = 300,
        end: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        host: bool = False,
    ) -> dict[str, Any]:
        span = parse_window(window)
        stop = end if end is not None else time.time()
        store = daemon.telemetry_reader()
        if host:
            metrics = metric or ["cpu_percent", "mem_used"]
            bad = [m for m in metrics if m not in HOST_METRICS]
            if bad:
                raise UserError(f"unknown host metric {bad[0]} — choose from: {', '.join(HOST_METRICS)}")
            return store.host_history(metrics, stop - span, stop, points).to_dict()
        return store.history(gpu, metric or ["util_gpu", "mem_used"], stop - span, stop, points).to_dict()

    @app.get("/v1/metrics-names", summary="metric names history accepts")
    def metric_names() -> dict[str, Any]:
        return {"gpu": list(GPU_METRICS), "host": list(HOST_METRICS)}

    # -- runs ------------------------------------------------------------------------------------------

    @app.get("/v1/runs", summary="runs, newest first")
    def list_runs(
        state: Annotated[list[RunState] | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        return {"runs": [run_summary(r) for r in daemon.runs().list_runs(states=state, limit=limit)]}

    @app.post("/v1/runs", status_code=201, summary="submit a run spec")
    def submit(body: SubmitRequest) -> dict[str, Any]:
        spec: RunSpec
        if body.spec_yaml is not None:
            spec = parse_spec(body.spec_yaml, label=body.label or "spec")
        else:
            assert body.spec is not None
            spec = spec_from_mapping(body.spec, label=body.label or "spec")
        if body.base_dir is not None:
            spec = resolve_relative_paths(spec, Path(body.base_dir))
        run = daemon.supervisor.submit(
            spec, submitted_text=body.spec_yaml, label=body.label or "spec", check_inputs=body.check_inputs
        )
        return detail(run)

    @app.get("/v1/runs/{ref}", summary="one run: state, spec, attempts, retunes, report")
    def get_run(ref: str) -> dict[str, Any]:
        return detail(resolve(ref))

    @app.patch("/v1/runs/{ref}", summary="edit a queued run's name, knobs or resources")
    def edit_run(ref: str, body: EditRequest) -> dict[str, Any]:
        run = resolve(ref)
        return detail(daemon.supervisor.edit_run(run["id"], body.model_dump(exclude_none=True)))

    @app.delete("/v1/runs/{ref}", summary="forget a finished run and remove its directory")
    def delete_run(ref: str) -> dict[str, Any]:
        run = resolve(ref)
        daemon.supervisor.delete_run(run["id"])
        return {"deleted": run["id"]}

    @app.post(
        "/v1/runs/{ref}/stop", summary="SIGTERM the run's process group, SIGKILL after the grace period"
    )
    def stop_run(ref: str, body: StopRequest | None = None) -> dict[str, Any]:
        run = resolve(ref)
        grace = body.grace_seconds if body is not None else None
        return detail(daemon.supervisor.stop_run(run["id"], grace))

    @app.post("/v1/runs/{ref}/resume", summary="queue a new attempt of a failed, stopped or interrupted run")
    def resume_run(ref: str) -> dict[str, Any]:
        run = resolve(ref)
        return detail(daemon.supervisor.resume_run(run["id"]))

    @app.post(
        "/v1/runs/{ref}/tune", summary="probe for the fastest micro-batch before the run's next attempt"
    )
    def tune_run(ref: str) -> dict[str, Any]:
        run = resolve(ref)
        return detail(daemon.supervisor.tune_run(run["id"]))

    @app.get("/v1/runs/{ref}/attempts", summary="the run's attempts")
    def attempts(ref: str) -> dict[str, Any]:
        return {"attempts": daemon.runs().attempts(resolve(ref)["id"])}

    @app.get("/v1/runs/{ref}/retunes", summary="the run's retunes (from → to, verdict, evidence)")
    def retunes(ref: str) -> dict[str, Any]:
        return {"retunes": daemon.runs().retunes(resolve(ref)["id"])}

    @app.get("/v1/runs/{ref}/metrics", summary="progress metrics reported by the run")
    def metrics(ref: str, limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> dict[str, Any]:
        return {"metrics": daemon.runs().metrics(resolve(ref)["id"], limit)}

    @app.get("/v1/runs/{ref}/events", summary="run events with id > since (long-poll with wait)")
    def events(
        ref: str,
        since: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> dict[str, Any]:
        run = resolve(ref)
        deadline = time.monotonic() + wait
        while True:
            store = daemon.runs()
            rows = store.events(run["id"], since=since, limit=limit)
            current = store.get_run(run["id"])
            state = current["state"] if current else "deleted"
            if rows or state in FINAL_STATES or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        next_since = rows[-1]["id"] if rows else since
        return {"events": rows, "next_since": next_since, "state": state}

    @app.get("/v1/runs/{ref}/logs", summary="a slice of an attempt's stdout/stderr by byte offset")
    def logs(
        ref: str,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
        offset: Annotated[
            int | None, Query(ge=-MAX_LOG_CHUNK, le=2**62, description="<0: from the end")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = 65536,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="long-poll for new data")] = 0.0,
    ) -> dict[str, Any]:
        run = resolve(ref)
        number = attempt or run["attempt"]
        if number == 0:
            return {
                "data": "",
                "offset": 0,
                "next_offset": 0,
                "eof": run["state"] in FINAL_STATES,
                "overflow": False,
                "attempt": 0,
                "stream": stream,
                "size": 0,
            }
        row = daemon.runs().attempt(run["id"], number)
        if row is None:
            raise UserError(
                f"run {run['id']} has no attempt {number} (it has {run['attempt']})", code="not_found"
            )
        path = Path(row[f"{stream}_path"])
        deadline = time.monotonic() + wait
        while True:
            chunk = read_log(path, offset, limit)
            if chunk["data"] or wait <= 0 or time.monotonic() >= deadline:
                break
            current = daemon.runs().attempt(run["id"], number)
            if current is None or current["state"] == "ended":
                chunk = read_log(path, offset, limit)
                break
            time.sleep(0.2)
        current = daemon.runs().attempt(run["id"], number)
        ended = current is None or current["state"] == "ended"
        chunk["eof"] = ended and chunk["next_offset"] >= chunk["size"]
        chunk.update(attempt=number, stream=stream)
        return chunk

    # -- live stream and control --------------------------------------------------------------------------

    @app.get("/v1/stream", summary="Server-Sent Events: sample, run and event frames")
    async def stream(
        kinds: Annotated[
            str, Query(max_length=64, description="comma list of sample, run, event")
        ] = "sample,run,event",
        run: Annotated[
            str | None, Query(max_length=200, description="only this run's run/event frames")
        ] = None,
    ) -> StreamingResponse:
        wanted = [k.strip() for k in kinds.split(",") if k.strip()]
        bad = [k for k in wanted if k not in FRAME_TYPES]
        if bad or not wanted:
            raise UserError(
                f"kinds: unknown frame kind {bad[0] if bad else '(none)'} — use {', '.join(FRAME_TYPES)}"
            )
        run_id = (await run_in_threadpool(resolve, run))["id"] if run else None
        client = daemon.broadcaster.subscribe(asyncio.get_running_loop(), wanted, run_id)

        async def body() -> Any:
            try:
                async for text in client.frames():
                    yield text
            finally:
                daemon.broadcaster.unsubscribe(client)

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    @app.post("/v1/shutdown", summary="stop the daemon (runs keep running and are re-adopted later)")
    def shutdown() -> dict[str, Any]:
        daemon.request_shutdown()
        return {"stopping": True, "pid": os.getpid()}

    return app


def read_log(path: Path, offset: int | None, limit: int) -> dict[str, Any]:
    """supervisord-style tail: bytes from `offset` (negative: that many from the end; None: the
    last `limit`), never splitting a UTF-8 character; `overflow` when bytes were skipped."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    overflow = False
    if offset is None or offset < 0:
        want = limit if offset is None else min(-offset, limit)
        start = max(0, size - want)
        overflow = start > 0
    else:
        start = min(offset, size)
    data = b""
    if size > start:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(min(limit, size - start))
    data = data[: _utf8_complete(data)]
    return {
        "data": data.decode("utf-8", "replace"),
        "offset": start,
        "next_offset": start + len(data),
        "overflow": overflow,
        "size": size,
    }


def _utf8_complete(data: bytes) -> int:
    """Length of `data` without a trailing incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return len(data)
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(data) if back >= need else len(data) - back
    return len(data)
