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
