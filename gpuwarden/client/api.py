"""`ApiClient`: typed calls to the daemon over its Unix socket (httpx), errors as UserError.

Every answer is parsed into the API's own models (`gpuwarden.core.api`), the ones the daemon
serves, so a field the daemon renames breaks here, loudly, not in a caller's dict lookup.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from gpuwarden.client.sse import StreamFrame, parse_sse
from gpuwarden.core import api
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_ref import MAX_REF_CHARS
from gpuwarden.core.submission import DEADLINE_HEADER, KEY_HEADER

if TYPE_CHECKING:
    from gpuwarden.core.api import (
        Attempt,
        Deleted,
        EventsPage,
        GpuList,
        Health,
        HistoryAnswer,
        HostProcesses,
        HostReading,
        LiveProcess,
        LogChunk,
        ProcessReads,
        Retune,
        RunDetail,
        RunMetric,
        RunSummary,
        ShutdownResult,
        TerminateResult,
    )


API_MAJOR = 1
NOT_RUNNING = "the daemon is not running — start it with `gpuwarden up`"
Model = TypeVar("Model", bound=BaseModel)
IDEMPOTENT = frozenset({"GET", "HEAD"})
# A submit reads the spec's files (a command run's config, its inputs) on the daemon: it may take
# longer than a read. The daemon is told to give up this much before the client does, so that
# its answer, or its not queueing the run, comes while the client still waits.
SUBMIT_TIMEOUT_S = 30.0
SUBMIT_MARGIN_S = 3.0
# What a request sent on a connection the server had closed fails with (no answer came).
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def default_socket() -> Path:
    """The daemon's socket: $GPUWARDEN_SOCKET, else where the settings put the runtime dir."""
    env = os.environ.get("GPUWARDEN_SOCKET")
    if env:
        return Path(env).expanduser()
    from gpuwarden.core.paths import default_config_file, default_paths

    config = default_config_file()
    configured = config.exists() or config.is_symlink()
    if not configured and not any(k.startswith("GPUWARDEN_") for k in os.environ):
        # Nothing could move it from the default: the settings (their models and YAML reader, a
        # fifth of a quick command's start) need not load to say so.
        return default_paths().socket
    from gpuwarden.core.config.settings import load_settings

    return load_settings().resolve_paths().socket


class ApiClient:
    """One connection pool to one daemon. The API version is checked on first use."""

    def __init__(
        self, socket_path: Path | None = None, timeout: float = 10.0, submit_timeout: float = SUBMIT_TIMEOUT_S
    ) -> None:
        self.socket_path = socket_path or default_socket()
        self.submit_timeout = submit_timeout
        # A local Unix socket: no TLS (building the default certificate store costs every CLI call
        # a tenth of a second) and nothing from the environment (proxies, .netrc) applies.
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path), verify=False),
            base_url="http://gpuwarden",
            timeout=httpx.Timeout(timeout, connect=2.0),
            trust_env=False,
        )
        self._checked = False

    def close(self) -> None:
        self._client.close()

    def _closed(self) -> UserError:
        """A call on a client another thread closed (a host judged down, a dashboard closing):
        httpx says so with a RuntimeError, which is no bug of the caller's."""
        return UserError("the connection to the gpuwarden daemon was closed", code="closed")

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, check: bool = True, **kwargs: Any) -> Any:
        """The decoded JSON answer; UserError for any failure."""
        if check and not self._checked:
            self.check_version()
        try:
            response = self._send(method, path, **kwargs)
        except RuntimeError:
            if self._client.is_closed:
                raise self._closed() from None
            raise
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise self._not_running() from None
        except httpx.TimeoutException:
            if KEY_HEADER in kwargs.get("headers", {}):
                raise UserError(
                    f"the gpuwarden daemon did not answer {method} {path} in time, and queues no "
                    "submit it could not answer in time: nothing was queued — submit again "
                    "(`gpuwarden status` says whether the daemon is busy)",
                    code="timeout",
                ) from None
            raise UserError(
                f"the gpuwarden daemon did not answer {method} {path} in time", code="timeout"
            ) from None
        except httpx.TransportError as exc:
            raise UserError(f"lost the connection to the gpuwarden daemon: {exc}", code="transport") from None
        return _decode(response)

    def _not_running(self) -> UserError:
        """No daemon at the socket. One named by GPUWARDEN_SOCKET is said so: `up`, `down` and the
        daemon itself go by the settings' runtime folder, so they may see a daemon this does not."""
        named = os.environ.get("GPUWARDEN_SOCKET")
        if named and Path(named).expanduser() == self.socket_path:
            return UserError(
                f"no daemon answers on {self.socket_path}, the socket GPUWARDEN_SOCKET names — "
                "unset it to reach the daemon `gpuwarden up` starts",
                code="not_running",
            )
        return UserError(NOT_RUNNING, code="not_running")

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request. The daemon closes a keep-alive connection after a few idle seconds; a read
        sent on a pooled connection just as it closed fails without an answer, so a GET (which
        changes nothing) is sent once more, on a new connection."""
        try:
            return self._client.request(method, path, **kwargs)
        except STALE_CONNECTION:
            # A submit with its key is safe to send again: the daemon answers the run the first
            # one queued, if it did.
            if method not in IDEMPOTENT and KEY_HEADER not in kwargs.get("headers", {}):
                raise
        return self._client.request(method, path, **kwargs)

    def _call(self, model: type[Model], method: str, path: str, **kwargs: Any) -> Model:
        """The answer parsed into `model`."""
        return _parse(model, self._request(method, path, **kwargs), f"{method} {path}")

    def check_version(self) -> None:
        """Refuse a daemon speaking another major API version."""
        self._version_of(self._request("GET", "/v1/health", check=False))

    def _version_of(self, health: Any) -> None:
        version = str(health.get("api_version", "0")) if isinstance(health, dict) else "0"
        if version.split(".")[0] != str(API_MAJOR):
            raise UserError(
                f"the running daemon speaks API v{version}, this client v{API_MAJOR} — restart it"
                " (`gpuwarden down && gpuwarden up`) or use the matching gpuwarden",
                code="api_version",
            )
        self._checked = True

    # -- daemon and telemetry ----------------------------------------------------------------------------

    def health(self) -> Health:
        answer = self._request("GET", "/v1/health", check=False)
        self._version_of(answer)
        return _parse(api.Health, answer, "GET /v1/health")

    def gpus(self) -> GpuList:
        return self._call(api.GpuList, "GET", "/v1/gpus")

    def host(self) -> HostReading:
        return self._call(api.HostReading, "GET", "/v1/host")

    def host_processes(self, top: int = 20) -> HostProcesses:
        """The host's `top` busiest processes and `top` largest in memory, with their runs."""
        return self._call(api.HostProcesses, "GET", "/v1/host/processes", params={"top": top})

    def processes(self) -> list[LiveProcess]:
        """The latest process scan, each process with its run (None: not a run's)."""
        return self._call(api.LiveProcesses, "GET", "/v1/processes").processes

    def process_history(self, since: float, until: float, gpu: str | None = None) -> ProcessReads:
        """Every stored process read in [since, until)."""
        params: dict[str, Any] = {"since": since, "until": until}
        if gpu is not None:
            params["gpu"] = gpu
        return self._call(api.ProcessReads, "GET", "/v1/processes", params=params)

    def history(
        self,
        window: str = "1h",
        metrics: Sequence[str] = (),
        gpus: Sequence[str] = (),
        points: int = 300,
        end: float | None = None,
        host: bool = False,
    ) -> HistoryAnswer:
        params: dict[str, Any] = {"window": window, "points": points, "host": host}
        if metrics:
            params["metric"] = list(metrics)
        if gpus:
            params["gpu"] = list(gpus)
        if end is not None:
            params["end"] = end
        return self._call(api.HistoryAnswer, "GET", "/v1/history", params=params)

    def shutdown(self) -> ShutdownResult:
        return self._call(api.ShutdownResult, "POST", "/v1/shutdown")

    # -- runs --------------------------------------------------------------------------------------------

    def runs(self, states: Sequence[str] = ()) -> list[RunSummary]:
        params = {"state": list(states)} if states else None
        return self._call(api.RunList, "GET", "/v1/runs", params=params).runs

    def submit_yaml(
        self,
        text: str,
        base_dir: Path,
        label: str,
        check_inputs: bool = True,
        environment: Mapping[str, str] | None = None,
    ) -> RunDetail:
        """Submit a spec file's text; relative paths in it start from `base_dir`. The run's
        processes start from `environment` (None: from the daemon's)."""
        body: dict[str, Any] = {
            "spec_yaml": text,
            "base_dir": str(base_dir.resolve()),
            "label": label,
            "check_inputs": check_inputs,
        }
        if environment is not None:
            body["environment"] = carried(environment)
        return self._submit(body)

    def submit(self, spec: dict[str, Any], environment: Mapping[str, str] | None = None) -> RunDetail:
        """Submit a spec document; the run's processes start from `environment` (None: from the
        daemon's)."""
        body: dict[str, Any] = {"spec": spec}
        if environment is not None:
            body["environment"] = carried(environment)
        return self._submit(body)

    def _submit(self, body: dict[str, Any]) -> RunDetail:
        """POST /v1/runs with a new key, and the wait the daemon must answer within: a submit it
        cannot queue in time it does not queue, so a timeout here means nothing was queued."""
        wait = max(self.submit_timeout, 2 * SUBMIT_MARGIN_S)
        deadline = time.time() + wait - SUBMIT_MARGIN_S
        headers = {KEY_HEADER: uuid.uuid4().hex, DEADLINE_HEADER: f"{deadline:.3f}"}
        return self._call(api.RunDetail, "POST", "/v1/runs", json=body, headers=headers, timeout=wait)

    def run(self, ref: str) -> RunDetail:
        return self._call(api.RunDetail, "GET", f"/v1/runs/{_q(ref)}")

    def edit(self, ref: str, **changes: Any) -> RunDetail:
        """Change a run that is not running (the fields of EditRequest): `knobs={"lr": 0.01}`
        changes that knob and keeps the others, None removes one."""
        return self._call(api.RunDetail, "PATCH", f"/v1/runs/{_q(ref)}", json=changes)

    def stop(self, ref: str, grace_seconds: float | None = None) -> RunDetail:
        body = {"grace_seconds": grace_seconds} if grace_seconds is not None else None
        return self._call(api.RunDetail, "POST", f"/v1/runs/{_q(ref)}/stop", json=body)

    def resume(self, ref: str) -> RunDetail:
        return self._call(api.RunDetail, "POST", f"/v1/runs/{_q(ref)}/resume")

    def tune(self, ref: str) -> RunDetail:
        """Tune the run (probe micro-batch sizes) before its next attempt."""
        return self._call(api.RunDetail, "POST", f"/v1/runs/{_q(ref)}/tune")

    def terminate_process(self, pid: int, grace_seconds: float | None = None) -> TerminateResult:
        """SIGTERM a stray GPU process of yours, SIGKILL after the grace period."""
        body = {"grace_seconds": grace_seconds} if grace_seconds is not None else None
        return self._call(api.TerminateResult, "POST", f"/v1/processes/{int(pid)}/terminate", json=body)

    def delete(self, ref: str) -> Deleted:
        return self._call(api.Deleted, "DELETE", f"/v1/runs/{_q(ref)}")

    def attempts(self, ref: str) -> list[Attempt]:
        return self._call(api.AttemptList, "GET", f"/v1/runs/{_q(ref)}/attempts").attempts

    def retunes(self, ref: str) -> list[Retune]:
        return self._call(api.RetuneList, "GET", f"/v1/runs/{_q(ref)}/retunes").retunes

    def metrics(self, ref: str) -> list[RunMetric]:
        return self._call(api.MetricList, "GET", f"/v1/runs/{_q(ref)}/metrics").metrics

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> EventsPage:
        """Events after `since`; `wait` long-polls up to that many seconds for new ones."""
        params = {"since": since, "limit": limit, "wait": wait}
        return self._call(
            api.EventsPage, "GET", f"/v1/runs/{_q(ref)}/events", params=params, timeout=wait + 10
        )

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> LogChunk:
        """A slice of an attempt's output by byte offset (negative: from the end)."""
        params: dict[str, Any] = {"stream": stream, "limit": limit, "wait": wait}
        if attempt is not None:
            params["attempt"] = attempt
        if offset is not None:
            params["offset"] = offset
        return self._call(api.LogChunk, "GET", f"/v1/runs/{_q(ref)}/logs", params=params, timeout=wait + 10)

    def stream(
        self, kinds: Sequence[str] = ("sample", "run", "event"), run: str | None = None
    ) -> Iterator[StreamFrame]:
        """Live frames until the daemon ends the stream (or the caller stops iterating)."""
        if not self._checked:
            self.check_version()
        params: dict[str, Any] = {"kinds": ",".join(kinds)}
        if run is not None:
            params["run"] = run
        for last_try in (False, True):
            answered = False
            try:
                with self._client.stream(
                    "GET", "/v1/stream", params=params, timeout=httpx.Timeout(10.0, read=None)
                ) as response:
                    answered = True
                    if response.status_code >= 400:
                        response.read()
                        _decode(response)
                    yield from parse_sse(response.iter_lines())
                return
            except RuntimeError:
                if self._client.is_closed:
                    raise self._closed() from None
                raise
            except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
                raise self._not_running() from None
            except STALE_CONNECTION:
                if answered or last_try:
                    return  # the daemon closed the stream (shutdown)


def carried(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment a run is to start from, refused here in one line when the daemon would."""
    from gpuwarden.core.api.requests import environment_too_large  # the spec's models: submits only

    if (problem := environment_too_large(environment)) is not None:
        raise UserError(problem)
    return dict(environment)


def _q(ref: str) -> str:
    """A run reference as one path segment. An empty one, or one holding a `/` (the server
    decodes %2F before it routes), would reach another route: said here as the user meant it."""
    from urllib.parse import quote

    if not ref.strip():
        raise UserError("give a run: its id, its name or a unique prefix (`gpuwarden ps` lists them)")
    if "/" in ref or len(ref) > MAX_REF_CHARS:
        raise UserError(f"no run matches '{ref[:80]}' — see `gpuwarden ps`", code="not_found")
    return quote(ref, safe="")


def _parse(model: type[Model], answer: Any, what: str) -> Model:
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        raise UserError(
            f"the daemon's answer to {what} does not fit this client ({where}: {first['msg']})"
            " — restart the daemon (`gpuwarden down && gpuwarden up`) or use the matching gpuwarden",
            code="api_mismatch",
        ) from None


def _decode(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            problems = error.get("problems")
            if isinstance(problems, list) and problems:
                message = "\n".join(str(p) for p in problems)
            else:
                message = str(error.get("message", "error"))
            raise UserError(message, code=str(error.get("code", "error")))
        raise UserError(f"daemon answered HTTP {response.status_code}", code="http_error")
    return body
