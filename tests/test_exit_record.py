"""The exit-status recorder as the daemon starts it: a real subprocess in a session of its own,
signalled the way the daemon signals a run (its whole process group)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden.core.exit_record import (
    is_recorder,
    read_peak_rss,
    read_program_pid,
    read_status,
    recorded_argv,
)
from tests.daemon.conftest import wait_for

# Counts the signal named in argv[2] into the folder argv[1], says it is ready, then waits for a
# `go` file and exits with the number of signals it got.
COUNTING = textwrap.dedent("""
    import os, signal, sys, time
    folder, sig = sys.argv[1], getattr(signal, sys.argv[2])
    got = []
    def count(signum, frame):
        got.append(signum)
        with open(os.path.join(folder, "count"), "w") as fh:
            fh.write(str(len(got)))
    signal.signal(sig, count)
    with open(os.path.join(folder, "ready"), "w") as fh:
        fh.write(f"{os.getpid()} {os.getpgid(0)} {os.getsid(0)}")
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.02)
    sys.exit(len(got))
""")

# Says it is ready (its pid), then sleeps until it is killed.
SLEEPER = textwrap.dedent("""
    import os, sys, time
    with open(os.path.join(sys.argv[1], "ready"), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)
""")


def _start(tmp_path: Path, program: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        recorded_argv(program, str(tmp_path / "exit.json")),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _ready(tmp_path: Path) -> list[int]:
    def said() -> str:
        path = tmp_path / "ready"
        return path.read_text() if path.exists() else ""

    return [int(n) for n in wait_for(said, "the program to start").split()]


def _status(tmp_path: Path) -> dict[str, int]:
    """The record without the program's pid (the tests that know the pid check it; a program
    that could not start had none)."""
    doc = json.loads((tmp_path / "exit.json").read_text())
    assert isinstance(doc, dict)
    doc.pop("pid", None)
    doc.pop("maxrss", None)
    return doc


def test_the_programs_peak_resident_set_is_recorded(tmp_path: Path) -> None:
    # 300 MiB touched, then freed before the end: the peak is what it held, not what it holds.
    code = "b = bytearray(300 << 20); del b; b = bytearray(1 << 20)"
    proc = _start(tmp_path, [sys.executable, "-c", code])
    assert proc.wait(timeout=60) == 0
    peak = read_peak_rss(str(tmp_path / "exit.json"))
    assert peak is not None and 300 << 20 <= peak < 600 << 20
    small = tmp_path / "small"
    small.mkdir()
    assert _start(small, [sys.executable, "-c", "pass"]).wait(timeout=60) == 0
    small_peak = read_peak_rss(str(small / "exit.json"))
    assert small_peak is not None and small_peak < peak - (200 << 20)


@pytest.mark.parametrize(("code", "recorded"), [(0, {"code": 0}), (7, {"code": 7})])
def test_an_exit_code_is_recorded_and_passed_on(tmp_path: Path, code: int, recorded: dict[str, int]) -> None:
    proc = _start(tmp_path, ["sh", "-c", f"exit {code}"])
    assert proc.wait(timeout=60) == code
    assert _status(tmp_path) == recorded
    assert read_status(str(tmp_path / "exit.json")) == (code, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit.json"]  # no temporary file left


def test_sigterm_to_the_group_kills_the_program_and_the_recorder_dies_of_it_too(tmp_path: Path) -> None:
    proc = _start(tmp_path, [sys.executable, "-c", SLEEPER, str(tmp_path)])
    _ready(tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # what a daemon that is its parent sees
    assert _status(tmp_path) == {"signal": signal.SIGTERM}
    assert read_status(str(tmp_path / "exit.json")) == (None, signal.SIGTERM)


def test_sigkill_to_the_program_alone_is_recorded(tmp_path: Path) -> None:
    proc = _start(tmp_path, [sys.executable, "-c", SLEEPER, str(tmp_path)])
    (pid,) = _ready(tmp_path)
    os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer does
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert _status(tmp_path) == {"signal": signal.SIGKILL}
    # The pid the program had, not the recorder's: what `show` gives once the program is gone.
    assert read_program_pid(str(tmp_path / "exit.json")) == pid != proc.pid


@pytest.mark.parametrize(
    ("text", "status", "pid"),
    [
        ('{"code": 3}', (3, None), None),  # written by an earlier recorder: no pid
        ('{"signal": 9, "pid": 4242}', (None, 9), 4242),
        ('{"code": 0, "signal": 9}', None, None),
        ('{"pid": 4242}', None, None),
        ('{"code": 300, "pid": 1}', None, None),
        ('{"code": 0, "pid": "1"}', None, None),
        ('{"code": 0, "pid": -5}', (0, None), None),
        ('{"code": 0, "pid": 7, "maxrss": 1048576}', (0, None), 7),
        ('{"code": 0, "pid": 7, "maxrss": "big"}', None, None),
        ("[0]", None, None),
    ],
)
def test_records_are_read_strictly(tmp_path: Path, text: str, status: object, pid: int | None) -> None:
    path = tmp_path / "exit.json"
    path.write_text(text)
    assert read_status(str(path)) == status
    assert read_program_pid(str(path)) == pid


def test_sigkill_to_the_group_leaves_no_record(tmp_path: Path) -> None:
    proc = _start(tmp_path, [sys.executable, "-c", SLEEPER, str(tmp_path)])
    _ready(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert not (tmp_path / "exit.json").exists()  # the daemon falls back to what the run wrote


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_group_signal_reaches_the_program_once_and_the_recorder_waits_for_it(
    tmp_path: Path, name: str
) -> None:
    proc = _start(tmp_path, [sys.executable, "-c", COUNTING, str(tmp_path), name])
    _, group, session = _ready(tmp_path)
    assert group == session == proc.pid  # the program is in the recorder's group and session
    os.killpg(proc.pid, getattr(signal, name))
    wait_for(lambda: (tmp_path / "count").exists(), "the program to get the signal")
    assert proc.poll() is None, "the recorder must outlive the signal while its program runs"
    (tmp_path / "go").touch()
    assert proc.wait(timeout=60) == 1  # the program counted exactly one signal
    assert _status(tmp_path) == {"code": 1}


def test_a_program_that_cannot_start_is_recorded_as_127_with_one_line(tmp_path: Path) -> None:
    proc = _start(tmp_path, ["/nonexistent/program-xyz", "--flag"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 127
    assert _status(tmp_path) == {"code": 127}
    assert err.decode() == "gpuwarden: cannot start '/nonexistent/program-xyz': No such file or directory\n"


@pytest.mark.parametrize(
    "launcher",
    [[], ["sh", "-c", 'trap "" INT HUP TERM && exec "$@"', "sh"]],
    ids=["from-defaults", "from-nohup-or-a-background-job"],
)
def test_the_program_starts_with_the_signal_dispositions_a_plain_start_gives(
    tmp_path: Path, launcher: list[str]
) -> None:
    show = ["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"]
    plain = subprocess.run([*launcher, *show], capture_output=True, check=True, start_new_session=True).stdout
    proc = subprocess.run(
        [*launcher, *recorded_argv(show, str(tmp_path / "exit.json"))],
        capture_output=True,
        start_new_session=True,
    )
    assert proc.returncode == 0
    assert proc.stdout == plain  # nothing ignored or blocked that the program did not ask for


def test_the_recorder_loads_only_light_standard_modules() -> None:
    """It starts before every command attempt: nothing but the standard library, and not the
    costly parts of it."""
    code = (
        "import sys; before = set(sys.modules); import gpuwarden.core.exit_record; "
        "print(' '.join(set(sys.modules) - before))"
    )
    loaded = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    tops = {name.partition(".")[0] for name in loaded.stdout.split()}
    assert "gpuwarden" in tops
    assert tops - set(sys.stdlib_module_names) == {"gpuwarden"}
    assert not tops & {"pathlib", "json", "subprocess"}


def test_a_recorder_is_known_by_its_command_line_from_any_install_of_gpuwarden() -> None:
    py = sys.executable
    assert is_recorder(recorded_argv(["sleep", "9"], "/r/exit.json"))
    assert is_recorder([py, "-I", "/old/venv/site-packages/gpuwarden/core/exit_record.py", "s", "--", "x"])
    assert is_recorder([py, "-P", "-m", "gpuwarden.core.exit_record", "s", "--", "x"])  # an earlier daemon's
    assert not is_recorder([py, "train.py", "--", "gpuwarden.core.exit_record"])  # past where it would be
    assert not is_recorder([py, "/home/me/exit_record.py", "s", "--", "x"])
