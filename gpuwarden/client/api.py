"""`ApiClient`: typed calls to the daemon over its Unix socket (httpx), errors as UserError."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from gpuwarden.client.sse import StreamFrame, parse_sse
from gpuwarden.core.errors import UserError

API_MAJOR = 1
NOT_RUNNING = "gpuwarden daemon is not running — start it with `gpuwarden up`"


def default_socket() -> Path:
    """The daemon's socket: $GPUWARDEN_SOCKET, else where the settings put the runtime dir."""
    env = os.environ.get("GPUWARDEN_SOCKET")
    if env:
        return Path(env).expanduser()
    from gpuwarden.core.config.settings import load_settings

    return load_settings().resolve_paths().socket


class ApiClient:
    """One connection pool to one daemon. `check_version` runs on first use."""

    def __init__(self, socket_path: Path | None = None, timeout: float = 10.0) -> None:
        self.socket_path = socket_path or default_socket()
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)),
            base_url="http://gpuwarden",
            timeout=httpx.Timeout(timeout, connect=2.0),
        )
        self._checked: dict[str, Any] | None = None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, check: bool = True, **kwargs: Any) -> Any:
        if check and self._checked is None:
            self.check_version()
        try:
            response = self._client.request(method, path, **kwargs)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise UserError(NOT_RUNNING, code="not_running") from None
        except httpx.TimeoutException:
            raise UserError(
                f"the gpuwarden daemon did not answer {method} {path} in time", code="timeout"
            ) from None
        except httpx.TransportError as exc:
            raise UserError(f"lost the connection to the gpuwarden daemon: {exc}", code="transport") from None
        return _decode(response)

    def check_version(self) -> dict[str, Any]:
        """/v1/health; refuses a daemon speaking another major API version."""
        health = self._request("GET", "/v1/health", check=False)
        version = str(health.get("api_version", "0"))
        major = version.split(".")[0]
        if major != str(API_MAJOR):
            raise UserError(
                f"the running daemon speaks API v{version}, this client v{API_MAJOR} — restart it"
                " (`gpuwarden down && gpuwarden up`) or use the matching gpuwarden",
                code="api_version",
            )
        self._checked = health
        assert isinstance(health, dict)
        return health

    # -- daemon and telemetry ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self.check_version()

    def gpus(self) -> dict[str, Any]:
        return dict(self._request("GET", "/v1/gpus"))

    def host(self) -> dict[str, Any]:
        return dict(self._request("GET", "/v1/host"))

    def processes(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/v1/processes")["processes"])

    def process_history(self, since: float, until: float, gpu: str | None = None) -> dict[str, Any]:
        """Every stored process read in [since, until): {"processes": [...], "truncated": bool}."""
        params: dict[str, Any] = {"since": since, "until": until}
        if gpu is not None:
            params["gpu"] = gpu
        return dict(self._request("GET", "/v1/processes", params=params))

    def history(
        self,
        window: str = "1h",
        metrics: Sequence[str] = (),
        gpus: Sequence[str] = (),
        points: int = 300,
        end: float | None = None,
        host: bool = False,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"window": window, "points": points, "host": host}
        if metrics:
            params["metric"] = list(metrics)
        if gpus:
            params["gpu"] = list(gpus)
        if end is not None:
            params["end"] = end
        return dict(self._request("GET", "/v1/history", params=params))

    def shutdown(self) -> dict[str, Any]:
        return dict(self._request("POST", "/v1/shutdown"))

    # -- runs --------------------------------------------------------------------------------------------

    def runs(self, states: Sequence[str] = ()) -> list[dict[str, Any]]:
        params = {"state": list(states)} if states else None
        return list(self._request("GET", "/v1/runs", params=params)["runs"])

    def submit_yaml(self, text: str, base_dir: Path, label: str, check_inputs: bool = True) -> dict[str, Any]:
        """Submit a spec file's text; relative paths in it start from `base_dir`."""
        body = {
            "spec_yaml": text,
            "base_dir": str(base_dir.resolve()),
            "label": label,
            "check_inputs": check_inputs,
        }
        return dict(self._request("POST", "/v1/runs", json=body))

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._request("POST", "/v1/runs", json={"spec": spec}))

    def run(self, ref: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/runs/{_q(ref)}"))

    def edit(self, ref: str, **changes: Any) -> dict[str, Any]:
        return dict(self._request("PATCH", f"/v1/runs/{_q(ref)}", json=changes))

    def stop(self, ref: str, grace_seconds: float | None = None) -> dict[str, Any]:
        body = {"grace_seconds": grace_seconds} if grace_seconds is not None else None
        return dict(self._request("POST", f"/v1/runs/{_q(ref)}/stop", json=body))

    def resume(self, ref: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/runs/{_q(ref)}/resume"))

    def tune(self, ref: str) -> dict[str, Any]:
        """Tune the run (probe micro-batch sizes) before its next attempt."""
        return dict(self._request("POST", f"/v1/runs/{_q(ref)}/tune"))

    def terminate_process(self, pid: int, grace_seconds: float | None = None) -> dict[str, Any]:
        """SIGTERM a stray GPU process of yours, SIGKILL after the grace period."""
        body = {"grace_seconds": grace_seconds} if grace_seconds is not None else None
        return dict(self._request("POST", f"/v1/processes/{int(pid)}/terminate", json=body))

    def delete(self, ref: str) -> dict[str, Any]:
        return dict(self._request("DELETE", f"/v1/runs/{_q(ref)}"))

    def attempts(self, ref: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/v1/runs/{_q(ref)}/attempts")["attempts"])

    def retunes(self, ref: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/v1/runs/{_q(ref)}/retunes")["retunes"])

    def metrics(self, ref: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/v1/runs/{_q(ref)}/metrics")["metrics"])

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> dict[str, Any]:
        """{events, next_since, state}; `wait` long-polls up to that many seconds for new events."""
        params = {"since": since, "limit": limit, "wait": wait}
        return dict(self._request("GET", f"/v1/runs/{_q(ref)}/events", params=params, timeout=wait + 10))

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> dict[str, Any]:
        """{data, offset, next_offset, eof, overflow, size, attempt, stream}."""
        params: dict[str, Any] = {"stream": stream, "limit": limit, "wait": wait}
        if attempt is not None:
            params["attempt"] = attempt
        if offset is not None:
            params["offset"] = offset
        return dict(self._request("GET", f"/v1/runs/{_q(ref)}/logs", params=params, timeout=wait + 10))

    def stream(
        self, kinds: Sequence[str] = ("sample", "run", "event"), run: str | None = None
    ) -> Iterator[StreamFrame]:
        """Live frames until the daemon ends the stream (or the caller stops iterating)."""
        if self._checked is None:
            self.check_version()
        params: dict[str, Any] = {"kinds": ",".join(kinds)}
        if run is not None:
            params["run"] = run
        try:
            with self._client.stream(
                "GET", "/v1/stream", params=params, timeout=httpx.Timeout(10.0, read=None)
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _decode(response)
                yield from parse_sse(response.iter_lines())
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError):
            raise UserError(NOT_RUNNING, code="not_running") from None
        except httpx.RemoteProtocolError:
            return  # the daemon closed the stream (shutdown)


def _q(ref: str) -> str:
    from urllib.parse import quote

    return quote(ref, safe="")


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
