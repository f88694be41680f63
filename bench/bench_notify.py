"""Notifications through a real daemon: from a run's failure (its process's exit) to the message
at a receiver on 127.0.0.1 (apprise's json://), median of `REPEATS` runs.

1. One target that answers.
2. The same with a second target that accepts connections and never answers (its sends time out
   after 10 s): the first target's message, and the run's `failed` state, must not wait for it.
The program stamps the time just before it exits; the receiver stamps each post as it arrives.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.client import ApiClient
from gpuwarden.core.errors import UserError

REPO = Path(__file__).resolve().parents[1]
# Writes when it exits, then exits 1 (the run fails on its first attempt).
FAILING = "import time, sys; open(sys.argv[1], 'w').write(repr(time.time())); sys.exit(1)"


class _Receiver:
    """Keeps (arrival time, title) of every post."""

    def __init__(self) -> None:
        self.posts: list[tuple[float, str]] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                posts.append((time.time(), str(body.get("title"))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"json://127.0.0.1:{self.server.server_port}/hook"


class _Daemon:
    def __init__(self, root: Path, urls: list[str]) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="gwn", dir="/tmp"))
        (root / "c" / "gpuwarden").mkdir(parents=True)
        (root / "c" / "gpuwarden" / "config.yaml").write_text(
            yaml.safe_dump({"notify": {"urls": urls, "send_timeout": 10, "retries": 0}})
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))}
        env |= {"XDG_CONFIG_HOME": str(root / "c"), "XDG_STATE_HOME": str(root / "s")}
        env |= {
            "XDG_RUNTIME_DIR": str(self.runtime),
            "GPUWARDEN_FAKE_NVML": "h100x2",
            "PYTHONPATH": str(REPO),
        }
        self.socket = self.runtime / "gpuwarden" / "api.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "daemon"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._until(lambda: self._answers(), "the daemon to answer")

    def _answers(self) -> bool:
        try:
            with ApiClient(self.socket, timeout=5) as client:
                client.health()
            return True
        except UserError:
            return False

    @staticmethod
    def _until(check: Any, what: str, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.01)
        raise RuntimeError(f"gave up waiting for {what}")

    def fail_once(self, receiver: _Receiver, stamp: Path, name: str) -> tuple[float, float]:
        """(exit → message at the receiver, exit → `failed` state) for one failing run, in s."""
        spec = {
            "name": name,
            "kind": "command",
            "command": {"argv": [sys.executable, "-c", FAILING, str(stamp)]},
            "resources": {"gpus": 1},
        }
        with ApiClient(self.socket, timeout=30) as client:
            run_id = client.submit(spec).id
            arrived = self._until(
                lambda: next((t for t, title in receiver.posts if title == f"{name} failed"), None),
                "the message",
            )
            state = [e for e in client.events(run_id, limit=1000).events if e.type == "state"][-1]
        exited = float(stamp.read_text())
        return arrived - exited, float(state.ts) - exited

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.runtime, ignore_errors=True)


def _arm(work: Path, label: str, extra_urls: list[str]) -> dict[str, list[float]]:
    receiver = _Receiver()
    daemon = _Daemon(work / label, [receiver.url, *extra_urls])
    out: dict[str, list[float]] = {"message": [], "state": []}
    try:
        for n in range(REPEATS):
            message, state = daemon.fail_once(receiver, work / f"{label}-{n}.stamp", f"{label}-{n}")
            out["message"].append(message)
            out["state"].append(state)
    finally:
        daemon.stop()
        receiver.server.shutdown()
    return out


def run() -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="bench-notify-"))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        plain = _arm(work, "plain", [])
        hung = _arm(work, "hung", [f"json://127.0.0.1:{silent.getsockname()[1]}/hook"])
    finally:
        silent.close()
        shutil.rmtree(work, ignore_errors=True)
    return [
        figure_row(
            "run's process exits → message at a json:// receiver",
            plain["message"],
            "s",
            target="≤ 1 s",
            check=lambda v: v <= 1.0,
        ),
        figure_row(
            "  same, beside a receiver that never answers (10 s send timeout)",
            hung["message"],
            "s",
            target="≤ 1 s",
            check=lambda v: v <= 1.0,
        ),
        figure_row("  exit → `failed` state, one answering receiver", plain["state"], "s"),
        figure_row("  exit → `failed` state, beside one that never answers", hung["state"], "s"),
    ]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
