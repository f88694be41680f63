"""The CLI as a user drives it: up/down, run --follow, --json everywhere, one-line errors."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.client import NOT_RUNNING
from tests import preloaded
from tests.daemon.conftest import DaemonHandle, wait_for

SPEC = """\
name: counted
kind: command
command:
  argv: ["python3", "-c", "import sys; [print('n', i) for i in range({n})]; sys.exit({code})"]
knobs: {{n: 3, code: 0}}
resources: {{gpus: 1}}
"""


def test_cli_without_a_daemon_says_so_in_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    for args in (["status"], ["ps", "--json"], ["show", "x"], ["logs", "x"], ["history"]):
        result = gw.cli(*args)
        assert result.returncode != 0, args
        assert result.stdout == "", args
        assert result.stderr.strip() == f"gpuwarden: {NOT_RUNNING}", args


def test_a_socket_named_by_the_environment_is_named_when_nothing_answers(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    nowhere = gw.root / "nope.sock"
    result = gw.cli("status", env={"GPUWARDEN_SOCKET": str(nowhere)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"gpuwarden: no daemon answers on {nowhere}, the socket GPUWARDEN_SOCKET names"
    )
    assert gw.cli("status").returncode == 0  # the daemon the settings name is there


def test_follow_says_the_run_goes_on_when_the_daemon_stops_under_it(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    ticks = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
    run = _cli_popen(
        gw, "run", "--gpus", "0", "--name", "ticking", "--follow", "--", sys.executable, "-c", ticks
    )
    run_id = wait_for(lambda: _running_id(gw, "ticking"), "the run to start")
    followers = [run, _cli_popen(gw, "logs", "-f", run_id)]
    for follower in followers:  # each is following: it printed the run's output
        assert follower.stdout is not None and follower.stdout.readline().startswith("tick")
    gw.stop()
    for follower in followers:
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 2, err
        assert err.splitlines()[-1] == (
            f"gpuwarden: the daemon stopped while following {run_id}; the run goes on — "
            f"`gpuwarden up`, then `gpuwarden logs -f {run_id}`"
        )
    gw.start()
    assert gw.cli_json("show", run_id)["state"] == "running"


def _cli_popen(gw: DaemonHandle, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", *args],
        env=gw.env,
        cwd=gw.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _running_id(gw: DaemonHandle, name: str) -> str:
    """The id of the running run called `name`; empty while there is none."""
    with gw.client() as client:
        runs = [r for r in client.runs() if r.name == name and r.state == "running"]
    return runs[0].id if runs else ""


def test_up_run_follow_json_outputs_and_down(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    up = gw.cli_json("up")
    assert up["started"] is True and up["log"].endswith("daemon.log")
    again = gw.cli("up")
    assert again.returncode == 0 and "already running" in again.stdout
    second = gw.cli("daemon")
    assert second.returncode == 1
    assert f"gpuwarden daemon already running (pid {up['pid']})" in second.stderr

    ok = gw.write_spec("ok", SPEC.format(n="{n}", code="{code}"))
    follow = gw.cli("run", str(ok), "--follow")
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.splitlines() == ["n 0", "n 1", "n 2"]
    assert "succeeded" in follow.stderr

    (gw.root / "work").mkdir()
    relative = gw.write_spec("cwd", 'name: cwd\nkind: command\ncommand:\n  argv: ["pwd"]\n  cwd: work\n')
    pwd = gw.cli("run", str(relative), "--follow")
    assert pwd.returncode == 0 and pwd.stdout.strip() == str(gw.root / "work")

    failing = gw.write_spec("bad", SPEC.format(n="{n}", code="{code}").replace("code: 0", "code: 4"))
    failed = gw.cli("run", str(failing), "--follow", "--json")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["state"] == "failed"

    submitted = gw.cli_json("run", str(ok))
    run_id = submitted["id"]
    outputs: dict[str, Any] = {
        "status": gw.cli_json("status"),
        "ps": gw.cli_json("ps", "--all"),
        "show": gw.cli_json("show", run_id),
        "events": gw.cli_json("events", run_id),
        "logs": gw.cli_json("logs", run_id),
        "history": gw.cli_json("history", "--window", "10m", "--metric", "power_w"),
    }
    assert {r["id"] for r in outputs["ps"]["runs"]} >= {run_id}
    show = outputs["show"]
    for key in ("id", "name", "state", "attempts", "retunes", "effective_batch", "report"):
        assert key in show
    assert show["effective_batch"] is None
    done = gw.wait_state(run_id)
    assert done["state"] == "succeeded"
    assert gw.cli_json("logs", run_id)["data"] == "n 0\nn 1\nn 2\n"
    followed = gw.cli_json("logs", run_id, "--follow")  # the attempt has ended: returns at once
    assert followed["data"] == "n 0\nn 1\nn 2\n" and followed["eof"] is True
    rm = gw.cli_json("rm", run_id)
    assert rm == {"deleted": [run_id]}
    gone = gw.cli("show", run_id)
    assert gone.returncode == 2 and gone.stderr.startswith("gpuwarden: no run matches")

    down = gw.cli_json("down")
    assert down["stopped"] is True and down["pid"] == up["pid"]
    assert not gw.socket.exists()
    assert gw.cli_json("down") == {"stopped": False, "was_running": False}


def test_up_reports_the_log_tail_when_the_daemon_dies(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    gw.runtime_dir.mkdir(mode=0o700)
    gw.socket.write_text("not a socket")
    result = gw.cli("up")
    # The daemon's own one-line refusal, not the end of its log.
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpuwarden: ") and "exists and is not a socket" in result.stderr


def test_a_lock_that_cannot_be_opened_is_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    (gw.runtime_dir / "daemon.lock").mkdir(parents=True)
    for args in (["up"], ["daemon"]):
        result = gw.cli(*args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(
            f"gpuwarden: paths.runtime_dir: cannot open the daemon's lock {gw.runtime_dir / 'daemon.lock'} ("
        ), result.stderr


def test_a_second_daemon_on_the_same_database_is_refused_in_one_line(daemon_factory: Any) -> None:
    # A shell without XDG_RUNTIME_DIR (cron, some SSH sessions) finds the daemon's runtime folder
    # elsewhere: the database lock still tells the two apart.
    gw: DaemonHandle = daemon_factory()
    elsewhere = {**gw.env, "XDG_RUNTIME_DIR": str(gw.root / "other-runtime")}
    (gw.root / "other-runtime").mkdir(mode=0o700)
    second = preloaded.run([sys.executable, "-m", "gpuwarden", "up"], env=elsewhere, timeout=60)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    pid = gw.cli_json("status")["daemon"]["pid"]
    assert second.stderr.startswith(
        f"gpuwarden: another gpuwarden daemon (pid {pid}, socket {gw.socket}) uses"
    )
    assert f"GPUWARDEN_SOCKET={gw.socket} gpuwarden" in second.stderr
    assert gw.cli_json("status")["daemon"]["pid"] == pid  # the first one goes on


def test_a_database_in_a_folder_not_made_yet_is_made_and_one_that_cannot_be_is_one_line(
    daemon_factory: Any,
) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    up = [sys.executable, "-m", "gpuwarden", "up"]
    for where, says in (
        ("/proc/gpuwarden/x.db", "paths.db: cannot create the folder /proc/gpuwarden"),
        ("/dev/null/x.db", "paths.db: cannot create the folder /dev/null"),
    ):
        env = {**gw.env, "GPUWARDEN_PATHS__DB": where}
        refused = preloaded.run(up, env=env, timeout=60, cwd=gw.root)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith(f"gpuwarden: {says}"), refused.stderr
    db = gw.root / "data" / "new" / "gw.db"
    gw.env["GPUWARDEN_PATHS__DB"] = str(db)
    gw.start()
    assert Path(gw.cli_json("status")["daemon"]["db"]) == db
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_an_unknown_fake_gpu_scenario_is_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    env = {**gw.env, "GPUWARDEN_FAKE_NVML": "bogus"}
    for args in (["up"], ["gpus"]):
        done = preloaded.run([sys.executable, "-m", "gpuwarden", *args], env=env, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("gpuwarden: GPUWARDEN_FAKE_NVML: unknown fake NVML scenario 'bogus'")


def test_run_refs_that_name_no_run_are_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    for args, says in (
        (["show", ""], "give a run: its id, its name or a unique prefix"),
        (["rm", ""], "give a run: its id, its name or a unique prefix"),
        (["stop", " "], "give a run: its id, its name or a unique prefix"),
        (["show", "r1/events"], "no run matches 'r1/events'"),
        (["logs", "x" * 200], "no run matches 'xxxx"),
    ):
        result = gw.cli(*args)
        assert result.returncode == 2 and result.stdout == "", args
        assert result.stderr.startswith(f"gpuwarden: {says}") and result.stderr.count("\n") == 1, (
            result.stderr
        )


@pytest.mark.slow
def test_down_leaves_runs_running_and_up_readopts_them(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    gw.cli_json("up")
    spec = gw.write_spec("sleepy", 'name: sleepy\nkind: command\ncommand:\n  argv: ["sleep", "30"]\n')
    run_id = gw.cli_json("run", str(spec))["id"]
    pid = gw.wait_state(run_id, ("running",))["attempts"][0]["pid"]
    gw.cli_json("down")
    os.kill(pid, 0)
    gw.cli_json("up")
    with gw.client() as client:
        assert client.run(run_id).state == "running"
    stopped = gw.cli_json("stop", run_id, "--grace", "1")
    assert stopped["state"] == "stopped"
    resumed = gw.cli_json("resume", run_id)
    assert resumed["state"] in ("queued", "starting", "running")
    gw.wait_state(run_id, ("running",))
    gw.cli_json("stop", run_id, "--grace", "0")
    gw.cli_json("down")
    wait_for(lambda: not gw.socket.exists(), "the daemon to remove its socket")


def test_resume_follow_shows_the_new_attempt_alone_and_exits_with_its_outcome(
    daemon_factory: Any, tmp_path: Path
) -> None:
    gw: DaemonHandle = daemon_factory()
    script = "if [ -e tried ]; then echo second attempt; else touch tried; echo first attempt; exit 3; fi"
    failed = gw.cli("run", "--name", "twice", "--follow", "--", "sh", "-c", script, cwd=tmp_path)
    assert failed.returncode == 1 and "first attempt" in failed.stdout, failed.stderr

    resumed = gw.cli("resume", "twice", "-f")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "second attempt\n"  # the failed attempt's output is in `logs`, not here
    assert "resumed" in resumed.stderr and "[2] state: running" in resumed.stderr
    assert "[1] state: failed" not in resumed.stderr  # nor its events
    assert resumed.stderr.rstrip().endswith("succeeded — attempt 2: exit code 0")


def test_history_for_gpus_and_the_host_with_units(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    gw.wait_samples(3)
    gpus = gw.cli("history", "--window", "5m", "--metric", "power_w", "--metric", "mem_used")
    assert gpus.returncode == 0, gpus.stderr
    lines = gpus.stdout.splitlines()
    assert lines[0].startswith("5m window, raw tier")
    power = [line for line in lines if "power_w" in line]
    assert [line.split()[:2] for line in power] == [["GPU", "0"], ["GPU", "1"]]
    assert all(" W  mean " in line and "max" in line for line in power)
    assert all(re.search(r"last [\d.]+ [KMG]iB ", line) for line in lines if "mem_used" in line)

    host = gw.cli("history", "--host", "--window", "5m")
    assert host.returncode == 0, host.stderr
    assert {line.split()[1] for line in host.stdout.splitlines()[1:]} == {"cpu_percent", "mem_used"}
    as_json = gw.cli_json("history", "--host", "--window", "5m", "--metric", "load1")
    assert list(as_json["series"]) == ["host"] and as_json["series"]["host"]["load1"]
    one = gw.cli("history", "--host", "--window", " 5m ", "--points", "1", "--metric", "load1")
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("5m window,") and one.stdout.rstrip().endswith("(1 point)"), one.stdout

    for args, message in (
        (["--metric", "cpu_percent"], "cpu_percent is a host metric: add --host"),
        (["--host", "--metric", "util_gpu"], "unknown host metric util_gpu"),
        (["--host", "--gpu", "GPU-x"], "use one of them"),
    ):
        bad = gw.cli("history", *args)
        assert bad.returncode == 2 and bad.stdout == "", args
        assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_history_names_a_gpu_by_index_as_every_gpu_option_does(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    gw.wait_samples(2)
    second = gw.cli_json("gpus")["gpus"][1]
    by_index = gw.cli_json("history", "--window", "5m", "--gpu", "1")
    assert list(by_index["series"]) == [second["uuid"]]
    by_prefix = gw.cli_json("history", "--window", "5m", "--gpu", second["uuid"][:12])
    assert list(by_prefix["series"]) == [second["uuid"]]


def test_history_without_a_gpu_points_at_the_host(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    out = gw.cli("history", "--window", "5m")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("no GPU history: ") and "add --host" in out.stdout


def test_run_refuses_a_spec_whose_model_is_missing_unless_told(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    spec = gw.write_spec(
        "lm",
        "name: lm\nkind: train\nresources: {gpus: 0}\n"
        "train: {task: causal_lm, model: ./no-such-model, data: ./texts.jsonl}\n",
    )
    refused = gw.cli("run", str(spec))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"gpuwarden: {spec}:4: train.model: model directory {spec.parent / 'no-such-model'} does not exist"
        " (and 1 more) — fix the path, or submit with --no-check-inputs when a run creates it"
    )
    with gw.client() as client:
        assert client.runs() == []  # nothing was queued

    queued = gw.cli_json("run", str(spec), "--no-check-inputs")
    done = gw.wait_state(queued["id"], timeout=60)
    # The runner checks again when it starts; its error line becomes the run's message.
    assert done["state"] == "failed"
    assert done["message"] == (
        f"attempt 1: model directory {spec.parent / 'no-such-model'} does not exist — check train.model"
        " (exit code 2)"
    )


def test_run_with_an_unreadable_spec_file_is_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    binary = gw.root / "binary.yaml"
    binary.write_bytes(b'name: x\nkind: command\ncommand:\n  argv: ["\xff\xfe"]\n')
    for path, message in (
        (binary, f"gpuwarden: {binary}: not UTF-8 text (byte 41) — save it as UTF-8"),
        (gw.root / "missing.yaml", f"gpuwarden: {gw.root / 'missing.yaml'}: no such file — check the path"),
    ):
        result = gw.cli("run", str(path))
        assert (result.returncode, result.stdout, result.stderr.strip()) == (2, "", message)


def test_status_socket_is_what_curl_needs_even_without_a_runtime_dir(daemon_factory: Any) -> None:
    """The README's curl line: `curl --unix-socket "$(gpuwarden status --socket)" …`."""
    gw: DaemonHandle = daemon_factory(start=False)
    del gw.env["XDG_RUNTIME_DIR"]
    gw.socket = gw.state_dir / "run" / "api.sock"
    printed = gw.cli("status", "--socket")
    assert printed.returncode == 0 and printed.stdout.strip() == str(gw.socket)
    gw.start()
    socket = gw.cli("status", "--socket").stdout.strip()
    curl = subprocess.run(
        ["curl", "-s", "--unix-socket", socket, "http://localhost/v1/health"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(curl.stdout)["socket"] == socket


def test_ps_says_how_many_finished_runs_it_leaves_out(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    spec = {"kind": "command", "command": {"argv": ["true"]}, "resources": {"gpus": 0}}
    with gw.client() as client:
        ids = [client.submit({**spec, "name": f"quick-{n}"}).id for n in range(22)]
        wait_for(
            lambda: all(client.run(i).state == "succeeded" for i in ids), "22 runs to succeed", timeout=120
        )
    table = gw.cli("ps").stdout.splitlines()
    assert len(table) == 1 + 20 + 1  # header, the newest 20, the line about the rest
    assert table[-1] == "… and 2 older finished run(s) — gpuwarden ps --all lists every run"
    assert gw.cli_json("ps")["hidden_finished"] == 2
    every = gw.cli_json("ps", "--all")
    assert len(every["runs"]) == 22 and every["hidden_finished"] == 0


# Python, with Ctrl-C's signal as a terminal gives it: the test may itself run where SIGINT is
# ignored (a shell's background job), which every child would inherit.
AT_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, sys.argv[1:])",
    sys.executable,
]


def test_ctrl_c_stops_following_and_leaves_the_run_running(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    follow = subprocess.Popen(
        [
            *AT_A_TERMINAL,
            "-m",
            "gpuwarden",
            "run",
            "--follow",
            "--name",
            "sleeper",
            "--gpus",
            "0",
            "--",
            "sleep",
            "60",
        ],
        env=gw.env,
        cwd=gw.root,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stderr is not None
    seen = ""
    while "state: running" not in seen:  # the run has a process: now the user presses Ctrl-C
        line = follow.stderr.readline()
        assert line, seen
        seen += line
    follow.send_signal(signal.SIGINT)
    rest = follow.communicate(timeout=30)[1]
    assert follow.returncode == 130
    assert (
        "stopped following" in rest and "the run goes on — `gpuwarden stop" in rest and "aborted" not in rest
    )
    assert gw.cli_json("show", "sleeper")["state"] == "running"
    gw.cli("stop", "sleeper")


def test_rm_by_a_name_several_runs_share_asks_for_the_id(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    spec = {"name": "same", "kind": "command", "command": {"argv": ["true"]}, "resources": {"gpus": 0}}
    with gw.client() as client:
        older, newer = client.submit(spec).id, client.submit(spec).id
        wait_for(lambda: all(client.run(i).state == "succeeded" for i in (older, newer)), "both runs to end")
    refused = gw.cli("rm", "same")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"gpuwarden: 'same' names 2 runs ({newer}, {older}, newest first)")
    assert gw.cli_json("show", "same")["id"] == newer  # reading by name still finds the newest
    # A prefix of that one name reads as the name does; it removes no more than the name would.
    assert gw.cli_json("show", "sa")["id"] == newer
    by_prefix = gw.cli("rm", "sa")
    assert by_prefix.returncode == 2 and f"'sa' names 2 runs of 'same' ({newer}, {older}" in by_prefix.stderr
    assert gw.cli_json("rm", older) == {"deleted": [older]}
    assert gw.cli_json("rm", "same") == {"deleted": [newer]}  # the only one left of that name


def test_show_prints_the_command_each_attempt_ran(daemon_factory: Any) -> None:
    # A knob written as `{bs}` in a flag reaches the program only through argv: show it.
    gw: DaemonHandle = daemon_factory()
    script = gw.root / "train.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    flags = ["--name", "flags", "--gpus", "0", "--knob", "bs=16", "--role", "micro_batch=bs", "--follow"]
    done = gw.cli("run", *flags, "--", sys.executable, str(script), "--batch-size", "{bs}")
    assert done.returncode == 0, done.stderr
    shown = gw.cli("show", "flags").stdout
    assert f"\n    command {sys.executable} {script} --batch-size 16\n" in shown, shown


def test_up_typed_in_another_gpuwarden_checkout_starts_the_installed_daemon(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    checkout = gw.root / "checkout"
    (checkout / "gpuwarden").mkdir(parents=True)
    (checkout / "gpuwarden" / "__init__.py").write_text("")
    (checkout / "gpuwarden" / "__main__.py").write_text("open('shadowed', 'w').close()\n")
    # as a user types it: the console script, which itself never looks in the current folder
    script = Path(sys.executable).with_name("gpuwarden")
    up = subprocess.run([str(script), "up"], cwd=checkout, env=gw.env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    assert not (checkout / "shadowed").exists()
    assert gw.cli_json("status")["daemon"]["pid"] > 0
    assert gw.cli_json("down")["stopped"] is True


def test_a_program_that_takes_its_config_path_from_a_variable_gets_the_copy(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    (gw.root / "cfg.yaml").write_text("trainer: {batch: 8}\n")
    script = "import os; print(open(os.environ['CFG']).read(), end='')"
    spec = gw.write_spec(
        "envcfg",
        f"name: envcfg\nkind: command\nresources: {{gpus: 0}}\ncommand:\n"
        f'  argv: ["{sys.executable}", -c, "{script}"]\n'
        '  env: {CFG: "{config_file}"}\n  config_file: cfg.yaml\n'
        "  bind: {batch: {config: trainer.batch}}\n  roles: {micro_batch: batch}\n",
    )
    done = gw.cli("run", str(spec), "--follow")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trainer: {batch: 8}\n"


def test_a_script_that_catches_its_oom_is_told_why_nothing_was_retuned(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    code = "import sys; print('ERROR: ran out of memory at step 5', file=sys.stderr); sys.exit(1)"
    flags = ["--name", "caught", "--gpus", "0", "--knob", "bs=32", "--role", "micro_batch=bs", "--follow"]
    done = gw.cli("run", *flags, "--", sys.executable, "-c", code, "{bs}")
    assert done.returncode == 1
    message = gw.cli_json("show", "caught")["message"]
    assert message.startswith("attempt 1: exit code 1 — last stderr line: ERROR: ran out of memory at step 5")
    assert "(not retuned: only the allocator's own out-of-memory error is evidence" in message


def test_a_flag_the_daemon_refuses_is_named_as_typed(gw: DaemonHandle, tmp_path: Path) -> None:
    """`gpuwarden run --memory-limit lots -- …` is checked by the daemon, which reads a spec: the
    line names the flag typed, not the spec's key."""
    refused = gw.cli("run", "--memory-limit", "lots", "--", "true", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert (
        refused.stderr
        == "gpuwarden: --memory-limit: 'lots' is not a size — write one such as 6GiB or 1500MB\n"
    )
    walked = gw.cli("run", "--checkpoints", "/**/*.pt", "--", "true", cwd=tmp_path)
    assert walked.returncode == 2 and walked.stderr.startswith(
        "gpuwarden: --checkpoints: '/**/*.pt' searches the whole file system at every restart"
    )
