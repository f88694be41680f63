"""A `gpuwarden daemon` process in private XDG directories, with two fake H100s (forked, as the
commands run against it are, from an interpreter that imported gpuwarden once: tests/preloaded.py).

The runtime directory lives under a short /tmp path: a Unix socket path is limited to 107 bytes
and pytest's tmp_path names can be longer than that.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuwarden.client import ApiClient
from gpuwarden.core.errors import UserError
from tests import preloaded

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0
FINAL = ("succeeded", "failed", "stopped", "interrupted")


class DaemonHandle:
    """A daemon subprocess plus the environment that points clients at it."""

    def __init__(self, root: Path, runtime: Path, extra_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))},
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_RUNTIME_DIR": str(runtime),
            "GPUWARDEN_FAKE_NVML": "h100x2",
            "GPUWARDEN_SAMPLE_INTERVAL": "0.25",
            "GPUWARDEN_STOP_GRACE_SECONDS": "5",
            # The repository first; what the caller's path adds (the GPU check's wheels) after it.
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            **(extra_env or {}),
        }
        self.state_dir = root / "state" / "gpuwarden"
        self.runtime_dir = runtime / "gpuwarden"
        self.socket = self.runtime_dir / "api.sock"
        self.db = self.state_dir / "gpuwarden.db"
        self.log = root / "daemon-stderr.log"
        self.proc: preloaded.Process | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start `python -m gpuwarden daemon` and wait until /v1/health answers."""
        with self.log.open("ab") as log:
            self.proc = preloaded.popen(
                [sys.executable, "-m", "gpuwarden", "daemon"],
                env=self.env,
                stdout=log,
                stderr=log,
                cwd=self.root,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if self.socket.exists():
                try:
                    with self.client() as client:
                        client.health()
                    return
                except UserError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"daemon did not answer in {START_TIMEOUT_S}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM and wait (the daemon must exit cleanly); `gpuwarden down` for one started by `up`."""
        if self.proc is None and self.socket.exists():
            self.cli("down")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("daemon ignored SIGTERM for 20 s") from None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def kill_runs(self) -> None:
        """Kill every process group a run of this daemon started (runs outlive the daemon)."""
        if not self.db.exists():
            return
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            pids = [row[0] for row in conn.execute("SELECT pid FROM attempts WHERE pid IS NOT NULL")]
        except sqlite3.Error:
            pids = []
        finally:
            conn.close()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    # -- clients -------------------------------------------------------------------------------------

    def client(self, timeout: float = 10.0) -> ApiClient:
        return ApiClient(self.socket, timeout=timeout)

    def cli(
        self,
        *args: str,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `gpuwarden ARGS…` against this daemon, from a shell whose environment has `env`
        over the daemon's, in `cwd` (default: the folder the daemon started in)."""
        return preloaded.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env={**self.env, **(env or {})},
            timeout=timeout,
            cwd=cwd or self.root,
        )

    def cli_json(self, *args: str) -> Any:
        result = self.cli(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    # -- helpers ---------------------------------------------------------------------------------------

    def write_spec(self, name: str, body: str) -> Path:
        path = self.root / f"{name}.yaml"
        path.write_text(textwrap.dedent(body))
        return path

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit `spec`; the new run as its JSON document (what `gpuwarden run --json` prints)."""
        with self.client() as client:
            return client.submit(spec).model_dump(mode="json")

    def wait_samples(self, count: int = 2, gpus: int = 2) -> None:
        """Until the store holds `count` sampled points of each of `gpus` GPUs and of the host."""
        with self.client() as client:

            def enough() -> bool:
                per_gpu = client.history(window="5m", metrics=["mem_used"], points=1000).series
                host = client.history(window="5m", host=True, metrics=["mem_used"], points=1000).series
                series = [s.get("mem_used", []) for s in (*per_gpu.values(), *host.values())]
                return len(series) == gpus + 1 and all(len(points) >= count for points in series)

            wait_for(enough, f"{count} samples of {gpus} GPUs and the host")

    def wait_state(
        self, run_id: str, states: tuple[str, ...] = FINAL, timeout: float = 120.0
    ) -> dict[str, Any]:
        """The run's JSON document once it is in one of `states`. Every change of a run's state
        is one of its events: the wait is a long poll on them, woken by the next one, where asking
        twenty times a second cost the daemon and the test a core's tenth for the whole wait."""
        deadline = time.monotonic() + timeout
        since = 0
        with self.client() as client:
            while True:
                run = client.run(run_id)
                if run.state in states:
                    return run.model_dump(mode="json")
                left = deadline - time.monotonic()
                if left < 0:
                    raise AssertionError(
                        f"run {run_id} stuck in {run.state} (wanted {states}): {run.message}"
                    )
                since = client.events(run_id, since=since, wait=min(1.0, left)).next_since


def wait_for(condition: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """Poll `condition` until it returns something true; fail naming `what` after `timeout` s."""
    # The timeout only bounds a failure: generous, so a loaded machine is slower, never red.
    # Asked often at first (most conditions come soon), then at most four times a second: many
    # conditions ask the daemon or start a command, and a long wait must not cost a core.
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)


def command_spec(name: str, code: str, **extra: Any) -> dict[str, Any]:
    """A command run of `python -c CODE` (braces in CODE escaped from templating)."""
    escaped = textwrap.dedent(code).replace("{", "{{").replace("}", "}}")
    spec: dict[str, Any] = {
        "name": name,
        "kind": "command",
        "command": {"argv": [sys.executable, "-c", escaped]},
        "resources": {"gpus": 1},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


Freeze = Callable[..., None]


@pytest.fixture
def freeze(short_tmp: Path) -> Iterator[Freeze]:
    """`freeze(path, …)`: make files or folders immutable (even to root) until `thaw` or the
    test's end."""
    probe = short_tmp / "probe"
    probe.touch()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)]).returncode:
        pytest.skip("needs chattr +i (root, on a filesystem with the immutable flag: ext4, xfs, btrfs)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    frozen: list[Path] = []

    def freeze(*paths: Path) -> None:
        subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
        frozen.extend(paths)

    freeze.thaw = lambda: _thaw(frozen)  # type: ignore[attr-defined]
    try:
        yield freeze
    finally:
        _thaw(frozen)


def _thaw(frozen: list[Path]) -> None:
    for path in frozen:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    frozen.clear()


@pytest.fixture
def daemon_factory(tmp_path: Path, short_tmp: Path) -> Iterator[Any]:
    """Make (and later tear down) daemons; `daemon_factory(extra_env)` starts one."""
    handles: list[DaemonHandle] = []

    def make(extra_env: dict[str, str] | None = None, start: bool = True) -> DaemonHandle:
        handle = DaemonHandle(tmp_path, short_tmp, extra_env)
        handles.append(handle)
        if start:
            handle.start()
        return handle

    yield make
    for handle in handles:
        try:
            handle.stop()
        finally:
            handle.kill_runs()


@pytest.fixture
def gw(daemon_factory: Any) -> DaemonHandle:
    """A running daemon with two fake H100s, sampling at 4 Hz."""
    handle: DaemonHandle = daemon_factory()
    return handle
