"""`ps`, `show` and `status` as a person types them: quick to start, and fitted to the terminal.

Startup time itself is a benchmark (`python -m bench cli_start`); what keeps it short is what these
commands import, checked here in a fresh interpreter that runs each command against a live daemon.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios

from tests.daemon.conftest import DaemonHandle, command_spec

# What the everyday commands never load: the spec's models and loader, the OOM classifier, the
# store's SQL layer, the round-trip YAML library, and httpx's own command-line tool (rich).
NEVER = (
    "gpuwarden.core.config.spec",
    "gpuwarden.core.config.spec_command",
    "gpuwarden.core.api.requests",
    "gpuwarden.core.oom.classify",
    "gpuwarden.core.store",
    "gpuwarden.client.run_folders",
    "gpuwarden.cli.log_follow",
    "sqlite_utils",
    "ruamel",
    "rich",
    "httpx._main",
)


def _modules_of(gw: DaemonHandle, *args: str) -> tuple[str, set[str]]:
    """Run `gpuwarden ARGS` in a fresh interpreter; what it printed, and every module it loaded."""
    code = (
        "import json, sys\n"
        "from gpuwarden.cli.main import main\n"
        f"main({list(args)!r})\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=gw.env, capture_output=True, text=True, timeout=60, cwd=gw.root
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, set(json.loads(done.stderr))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_ps_show_and_status_load_only_what_they_use(gw: DaemonHandle) -> None:
    run_id = gw.submit(command_spec("startup", "print('hi')", resources={"gpus": 0}))["id"]
    gw.wait_state(run_id)
    out, modules = _modules_of(gw, "ps")
    assert run_id in out
    assert _loaded(modules, (*NEVER, "gpuwarden.cli.event_lines")) == []
    # Of the API's models, only the run list's module: the telemetry answers are not built.
    assert "gpuwarden.core.api.runs" in modules and "gpuwarden.core.api.telemetry" not in modules
    out, modules = _modules_of(gw, "show", run_id)
    assert f"{run_id}  startup  (command)" in out
    assert _loaded(modules, NEVER) == []
    out, modules = _modules_of(gw, "status")
    assert out.startswith("gpuwarden daemon ")
    assert _loaded(modules, NEVER) == []


def _lines(gw: DaemonHandle, columns: int | None, *args: str) -> list[str]:
    """What `gpuwarden ARGS` prints on a terminal `columns` wide (None: into a pipe, with COLUMNS
    set as a parent process may leave it, which a pipe does not go by)."""
    env = {k: v for k, v in gw.env.items() if k not in ("COLUMNS", "LINES")}
    argv = [sys.executable, "-m", "gpuwarden", *args]
    if columns is None:
        done = subprocess.run(argv, env={**env, "COLUMNS": "40"}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    try:
        while select.select([leader], [], [], 60)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end closed: the command has exited
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, stderr
    return out.decode().replace("\r\n", "\n").splitlines()


def test_ps_fits_80_columns_and_tells_runs_of_one_long_name_apart(gw: DaemonHandle) -> None:
    names = [f"oom-recovery-causal-lm-on-the-small-gpu-{n}" for n in (1, 2, 3)]
    ids = []
    for name in names:
        spec = command_spec(name, "import sys; sys.exit('the data loader ran out of shards, ' * 3)")
        ids.append(gw.submit({**spec, "resources": {"gpus": 0}})["id"])
    for run_id in ids:
        gw.wait_state(run_id)
    table = _lines(gw, 80, "ps")
    assert all(len(line) <= 80 for line in table), table
    assert table[0].split() == ["ID", "NAME", "STATE", "ATT", "CREATED", "MESSAGE"]  # not wrapped
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == set(ids)  # the ids whole
    shown = {rows[run_id].split()[1] for run_id in ids}
    assert len(shown) == 3 and all(name.endswith("-" + name[-1]) for name in shown)  # the tails kept
    assert all(line.endswith("…") for line in table[1:])  # the message is what gives way
    # To a pipe nothing is cut, whatever COLUMNS says: a script greps the whole message.
    piped = _lines(gw, None, "ps")
    assert {line.split()[1] for line in piped[1:]} == set(names)
    assert all("shards, the data loader" in line for line in piped[1:])
    # `show` wraps its long lines between words, under an indent (only a word longer than the
    # line, a path, stands alone past the edge), and loses none.
    detail = _lines(gw, 80, "show", ids[0])
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in detail), detail
    assert any(line.startswith("    ") and "shards" in line for line in detail)
    assert " ".join(detail).split() == " ".join(_lines(gw, None, "show", ids[0])).split()  # no word lost
