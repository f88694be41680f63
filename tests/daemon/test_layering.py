"""The daemon stays light (no rich/httpx/torch/textual even transitively); the client never
reaches into the daemon."""

from __future__ import annotations

import json
import subprocess
import sys


def _loaded(module: str) -> list[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return list(json.loads(out.stdout))


def test_daemon_imports_nothing_heavy() -> None:
    for module in ("gpuwarden.daemon.daemon", "gpuwarden.daemon.http", "gpuwarden.cli.daemon_cmds"):
        heavy = [
            m
            for m in _loaded(module)
            if m.split(".")[0] in ("torch", "transformers", "textual", "rich", "httpx")
        ]
        assert heavy == [], (module, heavy[:5])


def test_client_does_not_import_the_daemon() -> None:
    assert [m for m in _loaded("gpuwarden.client") if m.startswith("gpuwarden.daemon")] == []


def test_the_daemon_imports_the_round_trip_config_libraries_only_to_read_a_config_file() -> None:
    # ruamel.yaml and tomlkit: 65 modules, about 2.5 MB resident, used by command runs with a
    # `command.config_file` alone.
    for module in ("gpuwarden.daemon.daemon", "gpuwarden.daemon.http"):
        assert [m for m in _loaded(module) if m.split(".")[0] in ("ruamel", "tomlkit")] == [], module


def test_answering_requests_does_not_build_the_api_description() -> None:
    # Built once, the OpenAPI description stays resident (about 7 MB): the body cap and the 405
    # answer read the routes instead.
    from fastapi.testclient import TestClient

    from gpuwarden.daemon.http import create_app

    app = create_app(object())  # type: ignore[arg-type]  # neither answer reaches the daemon
    with TestClient(app) as client:
        assert client.delete("/v1/health").status_code == 405
        assert client.delete("/v1/health").headers["allow"] == "GET, OPTIONS"
        assert client.post("/v1/shutdown", content=b"x").status_code == 413
        assert client.post("/v1/runs", content=b"x" * 10**8).status_code == 413
    assert app.openapi_schema is None
