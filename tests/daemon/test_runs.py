"""Runs under a real daemon: success, failure, stop with grace, group kill, queue, edit, resume."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.units import size
from tests.daemon.conftest import FINAL, DaemonHandle, command_spec, wait_for
from tests.daemon.module_daemon import module_daemon


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


@pytest.fixture
def gw(shared_daemon: DaemonHandle) -> Iterator[DaemonHandle]:
    """The shared daemon; afterwards every run a test left active is stopped and ended, so the
    next test finds both GPUs free, as on a fresh daemon."""
    yield shared_daemon
    with shared_daemon.client() as client:
        for run in client.runs():
            if run.state not in FINAL:
                with contextlib.suppress(UserError):  # it may have ended since it was listed
                    client.stop(run.id, grace_seconds=0)
        wait_for(lambda: all(r.state in FINAL for r in client.runs()), "every run to end", timeout=30)


def _log(run: dict[str, object], stream: str = "stdout", attempt: int = 1) -> str:
    return (Path(str(run["run_dir"])) / "attempts" / str(attempt) / f"{stream}.log").read_text()


def test_command_run_succeeds_with_output_events_and_placement(gw: DaemonHandle) -> None:
    code = """
        import json, os, sys, time
        print("visible", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["CUDA_DEVICE_ORDER"], flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        print("knob", sys.argv[1], os.environ["LR"])
        with open(sys.argv[2], "a") as fh:
            fh.write(json.dumps({"v": 1, "type": "progress", "ts": time.time(), "step": 1, "samples_seen": 8,
                                 "loss": 0.5}) + "\\n")
    """
    spec = command_spec("ok", code, knobs={"bs": 16, "lr": 0.001})
    spec["command"]["argv"] += ["{bs}", "{events_file}"]
    spec["command"]["env"] = {"LR": "{lr}"}
    run = gw.submit(spec)
    assert run["state"] in ("queued", "starting", "running")
    done = gw.wait_state(run["id"])
    assert done["state"] == "succeeded", done["message"]
    out = _log(done)
    visible = out.splitlines()[0].split()
    assert visible[1].startswith("GPU-") and visible[2] == "PCI_BUS_ID"
    assert "knob 16 0.001" in out
    assert "to stderr" in _log(done, "stderr")
    assert done["attempts"][0]["gpus"] == [visible[1]]
    assert done["attempts"][0]["exit_code"] == 0
    assert (Path(done["run_dir"]) / "spec.yaml").exists()
    assert (Path(done["run_dir"]) / "attempts" / "1" / "resolved.yaml").exists()
    with gw.client() as client:
        events = [e.model_dump() for e in client.events(run["id"]).events]
        metrics = client.metrics(run["id"])
    progress = [e for e in events if e["type"] == "progress"]
    assert len(progress) == 1 and progress[0]["loss"] == 0.5
    assert [m.step for m in metrics] == [1]
    states = [e["state"] for e in events if e["type"] == "state"]
    assert states == ["queued", "starting", "running", "succeeded"]


def test_failing_run_is_failed_with_its_exit_code(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("bad", "import os, sys; print('pid', os.getpid()); sys.exit(7)"))
    done = gw.wait_state(run["id"])
    assert done["state"] == "failed"
    assert done["attempts"][0]["exit_code"] == 7
    assert "exit code 7" in done["message"]
    # Once it ended, the pid shown is still the one the program had, not its recorder's.
    program = int(gw.cli("logs", run["id"]).stdout.split()[1])
    assert done["attempts"][0]["program_pid"] == program != done["attempts"][0]["pid"]
    assert f"pid {program} " in gw.cli("show", run["id"]).stdout


def test_a_program_that_reports_nothing_still_has_its_peak_memory_in_show_and_report(
    gw: DaemonHandle,
) -> None:
    code = "b = bytearray(300 << 20); del b; print('done')"
    done = gw.wait_state(gw.submit(command_spec("held", code, resources={"gpus": 0}))["id"])
    assert done["state"] == "succeeded"
    peak = done["attempts"][0]["peak_rss"]
    assert 300 << 20 <= peak < 600 << 20
    shown = gw.cli("show", done["id"]).stdout
    assert f"peak RSS {size(peak)}" in shown
    (memory,) = [
        line for line in gw.cli("report", done["id"]).stdout.splitlines() if line.startswith("peak memory")
    ]
    assert memory.split(None, 2)[2] == f"{size(peak)} resident (the program's peak, as the kernel counted it)"
    assert gw.cli_json("report", done["id"])["memory"]["runner_peak_bytes"] == peak


def test_logs_of_a_run_with_several_attempts_says_whose_output_it_is_and_how_to_read_the_earlier(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    marker = tmp_path / "first-done"
    code = f"""
        import pathlib, sys
        marker = pathlib.Path({str(marker)!r})
        if not marker.exists():
            marker.touch()
            print("attempt one")
            sys.exit(75)
        print("attempt two")
    """
    restart = {"on": [{"exit_code": [75]}], "max": 1, "backoff": 0}
    done = gw.wait_state(gw.submit(command_spec("twice", code, restart=restart))["id"])
    assert done["state"] == "succeeded" and len(done["attempts"]) == 2
    read = gw.cli("logs", done["id"])
    assert read.stdout == "attempt two\n"
    assert (
        read.stderr
        == f"gpuwarden: {done['id']}: attempt 2's output; the one before: gpuwarden logs {done['id']} --attempt 1\n"
    )
    told = gw.cli(*read.stderr.rsplit(": ", 1)[1].split()[1:])
    assert told.stdout == "attempt one\n" and told.stderr == ""
    # Asked for an attempt, or as JSON, nothing more is said.
    assert gw.cli("logs", done["id"], "--attempt", "2").stderr == ""
    assert gw.cli_json("logs", done["id"])["data"] == "attempt two\n"


def test_logs_of_a_run_whose_traceback_is_on_stderr_says_so_and_how_to_read_it(gw: DaemonHandle) -> None:
    code = (
        "import sys; print('step 1 loss 2.3'); sys.exit(sys.stderr.write('ValueError: bad shape\\n') and 3)"
    )
    failed = gw.wait_state(gw.submit(command_spec("stderr-too", code))["id"])
    read = gw.cli("logs", failed["id"], "--tail", "4096")
    assert read.returncode == 0, read.stderr
    assert read.stdout == "step 1 loss 2.3\n"
    assert read.stderr == (
        f"gpuwarden: attempt 1 also wrote 22 B to stderr: gpuwarden logs {failed['id']} --tail 4096 --stderr\n"
    )
    told = gw.cli(*read.stderr.split(": ", 2)[2].split()[1:])
    assert told.stdout == "ValueError: bad shape\n" and told.stderr == ""
    # Nothing on stderr, nothing said; --json stays one document.
    quiet = gw.wait_state(gw.submit(command_spec("stdout-only", "print('done')"))["id"])
    assert gw.cli("logs", quiet["id"]).stderr == ""
    assert gw.cli_json("logs", failed["id"])["data"] == "step 1 loss 2.3\n"


def test_missing_program_fails_with_one_line(gw: DaemonHandle) -> None:
    spec = command_spec("nope", "")
    spec["command"]["argv"] = ["/nonexistent/program-xyz"]
    done = gw.wait_state(gw.submit(spec)["id"])
    assert done["state"] == "failed"
    assert "cannot start" in done["message"] and "\n" not in done["message"]


def test_stop_kills_a_sigterm_ignoring_run_after_the_grace_period(gw: DaemonHandle) -> None:
    code = """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", os.getpid(), flush=True)
        time.sleep(60)
    """
    run = gw.submit(command_spec("stubborn", code))
    gw.wait_state(run["id"], ("running",))
    program = int(_wait_for_output(gw, run["id"], "ready").split()[1])
    (attempt,) = gw.wait_state(run["id"], ("running",))["attempts"]
    pid = attempt["pid"]
    # The pid a person reads is the program's, not that of gpuwarden's exit-status recorder.
    assert attempt["program_pid"] == program != pid
    assert f"pid {program} " in gw.cli("show", run["id"]).stdout
    started = time.monotonic()
    with gw.client() as client:
        client.stop(run["id"], grace_seconds=0.5)
    done = gw.wait_state(run["id"], timeout=15)
    elapsed = time.monotonic() - started
    assert done["state"] == "stopped"
    assert done["attempts"][0]["signal"] == 9
    assert 0.4 < elapsed < 10
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_stop_kills_grandchildren_through_the_process_group(gw: DaemonHandle) -> None:
    code = """
        import subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c",
                 "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
                for _ in range(2)]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        time.sleep(60)
    """
    run = gw.submit(command_spec("family", code))
    line = _wait_for_output(gw, run["id"], "\n")
    grandchildren = [int(p) for p in line.split()]
    assert all(psutil.pid_exists(p) for p in grandchildren)
    with gw.client() as client:
        client.stop(run["id"], grace_seconds=0.5)
    done = gw.wait_state(run["id"], timeout=15)
    assert done["state"] == "stopped"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in grandchildren):
        time.sleep(0.05)
    assert not any(_alive(p) for p in grandchildren)


def test_third_run_waits_for_a_gpu_and_starts_when_one_finishes(gw: DaemonHandle) -> None:
    hold = "import time; time.sleep({secs})"
    first = gw.submit(command_spec("a", hold.format(secs=60)))
    second = gw.submit(command_spec("b", hold.format(secs=60)))
    third = gw.submit(command_spec("c", hold.format(secs=0)))
    a = gw.wait_state(first["id"], ("running",))
    b = gw.wait_state(second["id"], ("running",))
    assert a["attempts"][0]["gpus"] != b["attempts"][0]["gpus"]
    # A CPU run queued after the third: the pass that starts it has considered the third too.
    gw.wait_state(gw.submit(command_spec("d", "pass", resources={"gpus": 0}))["id"], ("succeeded",))
    with gw.client() as client:
        assert client.run(third["id"]).state == "queued"
        client.stop(first["id"], grace_seconds=0)
    c = gw.wait_state(third["id"])
    assert c["state"] == "succeeded"
    assert c["attempts"][0]["gpus"] == a["attempts"][0]["gpus"]


def test_cpu_run_and_named_gpu(gw: DaemonHandle) -> None:
    code = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    cpu = gw.wait_state(gw.submit(command_spec("cpu", code, resources={"gpus": 0}))["id"])
    assert _log(cpu).strip() == "''"
    named = gw.wait_state(gw.submit(command_spec("named", code, resources={"gpus": ["1"]}))["id"])
    with gw.client() as client:
        second_gpu = client.gpus().gpus[1].uuid
    assert _log(named).strip() == repr(second_gpu)


def test_memory_limit_sets_rlimit_as(gw: DaemonHandle) -> None:
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    run = gw.wait_state(gw.submit(command_spec("capped", code, resources={"memory_limit": "3GiB"}))["id"])
    assert run["state"] == "succeeded", run["message"]
    assert int(_log(run).strip()) == 3 * 1024**3


def test_queued_run_can_be_edited_stopped_resumed_and_removed(gw: DaemonHandle) -> None:
    with gw.client() as client:
        blockers = [client.submit(command_spec(f"hold{i}", "import time; time.sleep(60)")) for i in range(2)]
        for b in blockers:
            gw.wait_state(b.id, ("running",))
        spec = command_spec("queued", "import sys; print(sys.argv[1])", knobs={"x": 1})
        spec["command"]["argv"].append("{x}")
        run = client.submit(spec)
        edited = client.edit(run.id, knobs={"x": 42}, name="renamed")
        assert edited.name == "renamed" and edited.spec["knobs"] == {"x": 42}
        with pytest.raises(UserError) as bad:
            client.edit(run.id, knobs={"x": None})  # argv still needs it
        assert "unknown placeholder {x}" in str(bad.value)
        with pytest.raises(UserError) as running_edit:
            client.edit(blockers[0].id, name="zzz")
        assert running_edit.value.code == "conflict"
        stopped = client.stop(run.id)
        assert stopped.state == "stopped" and stopped.attempts == []
        with pytest.raises(UserError) as again:
            client.stop(run.id)
        assert again.value.code == "conflict"
        with pytest.raises(UserError) as active_rm:
            client.delete(blockers[0].id)
        assert active_rm.value.code == "conflict"
        for b in blockers:
            client.stop(b.id, grace_seconds=0)
        resumed = client.resume("renamed")
        assert resumed.state == "queued"
        done = gw.wait_state(run.id)
        assert done["state"] == "succeeded"
        assert _log(done).strip() == "42"
        client.delete(run.id)
        assert not Path(done["run_dir"]).exists()
        with pytest.raises(UserError) as gone:
            client.run(run.id)
        assert gone.value.code == "not_found"


def test_unknown_placeholder_is_rejected_at_submit(gw: DaemonHandle) -> None:
    spec = command_spec("typo", "pass")
    spec["command"]["argv"].append("--lr={lrr}")
    with gw.client() as client, pytest.raises(UserError) as err:
        client.submit(spec)
    assert "command.argv[3]: unknown placeholder {lrr}" in str(err.value)
    assert err.value.code == "bad_input"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_output(gw: DaemonHandle, run_id: str, text: str, timeout: float = 15.0) -> str:
    """The run's stdout once `text` is in it and the line that holds it is whole (a print's
    parts may reach the file in several writes, and the log be read between them)."""
    deadline = time.monotonic() + timeout
    with gw.client() as client:
        while time.monotonic() < deadline:
            chunk = client.logs(run_id, offset=0)
            at = chunk.data.find(text)
            if at >= 0 and chunk.data.find("\n", at) >= 0:
                return chunk.data
            time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {run_id}'s stdout")


def test_environment_is_not_leaking_the_daemon_lock(gw: DaemonHandle) -> None:
    """A run must not inherit the daemon's lock descriptor, or a dead daemon's lock would live on."""
    code = "import json, os; print(json.dumps(sorted(os.listdir('/proc/self/fd'))))"
    run = gw.wait_state(gw.submit(command_spec("fds", code))["id"])
    fds = json.loads(_log(run).strip())
    assert set(fds) <= {"0", "1", "2", "3"}, fds
    assert os.path.exists(gw.runtime_dir / "daemon.lock")


def test_show_reports_effective_batch_of_a_train_run(gw: DaemonHandle) -> None:
    spec = {
        "name": "tr",
        "kind": "train",
        "train": {"task": "image", "batch_size": 8, "grad_accum_steps": 2},
        # more free memory than a fake H100 has: the run stays queued and never spawns a runner
        "resources": {"gpus": 1, "min_free_memory": "200GiB"},
    }
    run = gw.submit(spec)
    shown = gw.cli_json("show", run["id"])
    assert shown["state"] == "queued"
    assert shown["effective_batch"] == 16
    assert shown["report"] is None and shown["retunes"] == [] and shown["attempts"] == []
    with gw.client() as client:
        client.stop(run["id"])


def test_without_gpus_runs_that_allow_it_go_to_the_cpu_with_a_warning(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": ""})  # real NVML: none here
    with gw.client() as client:
        status = client.health().gpu_status
        if not status.startswith("no NVIDIA driver"):
            pytest.skip(f"this machine has GPUs ({status})")
        code = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
        run = gw.wait_state(client.submit(command_spec("cpu", code)).id)
        assert run["state"] == "succeeded" and _log(run).strip() == "''"
        warnings = [e.model_dump() for e in client.events(run["id"]).events if e.type == "warning"]
        assert [w["code"] for w in warnings] == ["cpu_fallback"]
        with pytest.raises(UserError) as err:
            client.submit(command_spec("gpu-only", "pass", resources={"allow_cpu": False}))
        assert "allow_cpu is false" in str(err.value)


def test_a_stopped_training_run_is_edited_by_dotted_keys_then_resumed(gw: DaemonHandle) -> None:
    spec = {
        "name": "edit-me",
        "kind": "train",
        "resources": {"gpus": 0},
        "train": {"task": "image", "batch_size": 8, "grad_accum_steps": 1, "max_steps": 1},
    }
    with gw.client() as client:
        run = client.submit(spec)
        client.stop(run.id, grace_seconds=0.5)
        gw.wait_state(run.id)
        edited = client.edit(run.id, set={"train.batch_size": 2, "train.grad_accum_steps": 4})
        assert edited.state == "stopped"  # editing does not start it
        assert (edited.spec["train"]["batch_size"], edited.spec["train"]["grad_accum_steps"]) == (2, 4)
        with pytest.raises(UserError) as bad:
            client.edit(run.id, set={"train.batchsize": 2})
        assert "train.batchsize: unknown key — did you mean 'batch_size'?" in str(bad.value)
        with pytest.raises(UserError) as negative:
            client.edit(run.id, set={"train.batch_size": -1})
        assert "train.batch_size" in str(negative.value)
        assert client.run(run.id).spec["train"]["batch_size"] == 2  # a refused edit loses nothing


def test_a_spec_files_command_runs_in_the_files_folder_unless_cwd_says_otherwise(gw: DaemonHandle) -> None:
    """`argv: [./train.sh]` next to the spec works from any folder, as typed there would."""
    project = gw.root / "project"
    (project / "elsewhere").mkdir(parents=True)
    script = project / "train.sh"
    script.write_text("#!/bin/sh\necho in $(pwd)\n")
    script.chmod(0o755)
    for name, cwd in (("here", ""), ("there", "  cwd: elsewhere\n")):
        spec = project / f"{name}.yaml"
        argv = "[./train.sh]" if not cwd else f"[{script}]"
        spec.write_text(
            f"name: {name}\nkind: command\nresources: {{gpus: 0}}\ncommand:\n  argv: {argv}\n{cwd}"
        )
        done = gw.cli("run", "--follow", str(spec), cwd=gw.root)  # typed from another folder
        assert done.returncode == 0, done.stderr
        assert f"in {project / 'elsewhere' if cwd else project}\n" in done.stdout


def test_a_script_writing_non_finite_times_does_not_break_its_runs_events(gw: DaemonHandle) -> None:
    code = """
        import sys
        with open(sys.argv[1], "a") as fh:
            for ts in ("1e400", "-1e400", "NaN", "true"):  # what json.loads accepts, and a bool
                fh.write('{"v": 1, "type": "progress", "ts": %s, "step": 1, "samples_seen": 8}\\n' % ts)
    """
    spec = command_spec("odd-times", code, resources={"gpus": 0})
    spec["command"]["argv"] += ["{events_file}"]
    run = gw.submit(spec)
    assert gw.wait_state(run["id"])["state"] == "succeeded"
    for args in (["events", run["id"]], ["show", run["id"]], ["events", run["id"], "--json"]):
        result = gw.cli(*args)
        assert result.returncode == 0, result.stderr
    events = gw.cli_json("events", run["id"])["events"]
    assert [type(e["ts"]) for e in events if e["type"] == "progress"] == [float] * 4


def test_a_diverged_loss_and_infinite_counts_leave_show_and_report_working(gw: DaemonHandle) -> None:
    code = """
        import sys, time
        with open(sys.argv[1], "a") as fh:
            fh.write('{"v": 1, "type": "progress", "ts": %f, "step": 1e400, "samples_seen": 1e400,'
                     ' "loss": Infinity, "samples_per_s": 1e400}\\n' % time.time())
            fh.write('{"v": 1, "type": "progress", "ts": %f, "step": 2, "samples_seen": 16,'
                     ' "loss": NaN}\\n' % time.time())
    """
    spec = command_spec("diverged", code, resources={"gpus": 0})
    spec["command"]["argv"] += ["{events_file}"]
    run = gw.submit(spec)
    assert gw.wait_state(run["id"])["state"] == "succeeded"
    for args in (["show", run["id"]], ["report", run["id"]], ["doctor", run["id"]]):
        result = gw.cli(*args)
        assert result.returncode == 0, (args, result.stderr)
    with gw.client() as client:
        metrics = client.metrics(run["id"])
    assert [(m.step, m.samples_seen, m.loss) for m in metrics] == [(None, None, None), (2, 16, None)]


RESUMING_SCRIPT = """\
import argparse, pathlib, sys
parser = argparse.ArgumentParser()
parser.add_argument("--resume", action="store_true")  # finds its own newest checkpoint
parser.add_argument("--out", default="ckpt")
args = parser.parse_args()
out = pathlib.Path(args.out)
if not args.resume:
    (out / "step-2").mkdir(parents=True)
    (out / "step-2" / "state.pt").write_text("2")
    sys.exit(75)  # a failure the run's restart policy covers
print("resumed at step", max(p.name for p in out.iterdir()))
"""


def test_a_switch_without_a_value_is_passed_only_when_there_is_a_checkpoint(gw: DaemonHandle) -> None:
    # argparse's `store_true` takes no path: `{resume_from?--resume}` gives the switch alone.
    project = gw.root / "switch"
    project.mkdir()
    (project / "train.py").write_text(RESUMING_SCRIPT)
    spec = project / "switch.yaml"
    spec.write_text(
        "name: switch\nkind: command\nresources: {gpus: 0}\n"
        "restart: {on: [exit_code: [75]], max: 1, backoff: 0}\n"
        f'command:\n  argv: ["{sys.executable}", train.py, --out, ckpt, "{{resume_from?--resume}}"]\n'
        "  checkpoints: {glob: ckpt/step-*, complete_when: state.pt}\n"
    )
    done = gw.cli("run", "--follow", str(spec))
    assert done.returncode == 0, done.stderr
    assert "resumed at step step-2\n" in done.stdout
    first, second = gw.cli_json("show", "switch")["attempts"]
    assert first["prepared"]["argv"][-2:] == ["--out", "ckpt"]
    assert second["prepared"]["argv"][-3:] == ["--out", "ckpt", "--resume"]


def test_a_policy_file_beside_the_spec_is_found_from_any_folder(gw: DaemonHandle, tmp_path: Path) -> None:
    """`policy: ./mine.yaml` starts from the spec's folder, as every other relative path in it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mine.yaml").write_text("ladder:\n  - action: reduce_micro_batch\nmax_attempts: 2\n")
    spec = folder / "spec.yaml"
    spec.write_text('name: own-policy\nkind: command\ncommand: {argv: ["false"]}\npolicy: ./mine.yaml\n')
    # Typed in another folder (the daemon's), as a user names a spec by its path.
    assert gw.cli("doctor", str(spec)).returncode == 0
    submitted = gw.cli("run", str(spec), "--json")
    assert submitted.returncode == 0, submitted.stderr
    run = json.loads(submitted.stdout)
    assert run["spec"]["policy"] == str(folder / "mine.yaml")  # where the file is, for every retune
    assert gw.wait_state(run["id"])["state"] == "failed"  # `false`: a run that can be edited

    spec.write_text(spec.read_text().replace("./mine.yaml", "./theirs.yaml"))
    for command in ("run", "doctor"):
        refused = gw.cli(command, str(spec))
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        assert refused.stderr == (
            f"gpuwarden: {spec}:4: policy: {folder / 'theirs.yaml'}: no such file — check the path\n"
        )
    with gw.client() as client, pytest.raises(UserError) as relative:
        client.edit(run["id"], set={"policy": "./mine.yaml"})  # an edit has no folder to start from
    assert "policy: ./mine.yaml is a relative path" in str(relative.value)


def test_a_script_run_as_it_is_that_runs_out_of_memory_is_told_how_to_make_it_retunable(
    gw: DaemonHandle,
) -> None:
    """Step 1 of running your own script: no flags, then an OOM. The answer is the one step that
    makes it retunable, not a list of every knob the ladder found missing."""
    oom = (
        "import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB is free.\\n'); sys.exit(1)"
    )
    result = gw.cli("run", "--name", "as-it-is", "--follow", "--", sys.executable, "-c", oom)
    assert result.returncode == 1, result.stderr
    last = result.stderr.rstrip().splitlines()[-1]
    assert last.startswith("r") and ": failed — attempt 1: gpu_capacity" in last, last
    assert last.endswith(
        "; not retuned: gpu_capacity, and the run names no setting a retune may change — name the "
        "flag that sets the micro-batch, and the accumulation's where there is one (gpuwarden run "
        "--role micro_batch=batch-size --role accum_steps=grad-accum -- … --batch-size 32 --grad-accum 1; "
        "an override such as training.batch_size=32 the same way: --role micro_batch=training.batch_size), "
        "or command.roles in a spec"
    ), last
    # With a flag of its own that reads as the batch size, the answer names that flag.
    flagged = gw.cli(
        "run", "--name", "as-it-is", "--follow", "--", sys.executable, "-c", oom, "--batch_size", "64"
    )
    assert flagged.returncode == 1, flagged.stderr
    assert flagged.stderr.rstrip().endswith(
        "; not retuned: gpu_capacity, and the run names no setting a retune may change — if --batch_size "
        "sets the micro-batch, add --role micro_batch=batch_size (and --role accum_steps=… where the "
        "script accumulates gradients)"
    ), flagged.stderr


def test_a_scripts_own_flags_named_by_roles_are_retuned_keeping_the_effective_batch(gw: DaemonHandle) -> None:
    """Step 2: the roles name the script's own flags, as it writes them; the next OOM is retuned."""
    script = textwrap.dedent(
        """
        import argparse, sys
        p = argparse.ArgumentParser()
        p.add_argument("--batch-size", type=int)
        p.add_argument("--grad-accum", type=int)
        a = p.parse_args()
        if a.batch_size > 8:
            sys.stderr.write(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                "total capacity of 79.10 GiB of which 1.20 GiB is free.\\n"
            )
            sys.exit(1)
        print("ran with", a.batch_size, "x", a.grad_accum)
        """
    )
    result = gw.cli(
        "run", "--name", "own-flags", "--role", "micro_batch=batch-size", "--role", "accum_steps=--grad-accum",
        "--follow", "--", sys.executable, "-c", script, "--batch-size", "32", "--grad-accum", "1",
    )  # fmt: skip
    _retuned_from_32_x_1_to_fit(gw, "own-flags", result, "knobs.grad_accum")


def _retuned_from_32_x_1_to_fit(
    gw: DaemonHandle, name: str, result: subprocess.CompletedProcess[str], accum: str
) -> None:
    """The run ended well at a micro-batch of 8 or less, the effective batch of 32 kept."""
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    detail = gw.cli_json("show", name)
    assert detail["retunes"][0]["from"] == {"knobs.batch_size": 32, accum: 1}
    last = detail["retunes"][-1]["to"]
    assert last["knobs.batch_size"] <= 8 and last["knobs.batch_size"] * last[accum] == 32
    assert f"ran with {last['knobs.batch_size']} x {last[accum]}" in result.stdout


def test_a_script_that_reads_its_batch_size_from_a_variable_is_retuned_through_it(gw: DaemonHandle) -> None:
    """`BATCH_SIZE=32 ACCUM=1 python train.py`: roles naming the variables bind knobs to them."""
    script = textwrap.dedent(
        """
        import os, sys
        size, accum = int(os.environ["BATCH_SIZE"]), int(os.environ["ACCUM"])
        if size > 8:
            sys.stderr.write(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                "total capacity of 79.10 GiB of which 1.20 GiB is free.\\n"
            )
            sys.exit(1)
        print("ran with", size, "x", accum)
        """
    )
    env = {"ACCUM": "1"}  # one set in the shell (over the daemon's), one given with --env
    result = gw.cli(
        "run", "--name", "by-variable", "--env", "BATCH_SIZE=32", "--role", "micro_batch=BATCH_SIZE",
        "--role", "accum_steps=ACCUM", "--follow", "--", sys.executable, "-c", script, env=env,
    )  # fmt: skip
    _retuned_from_32_x_1_to_fit(gw, "by-variable", result, "knobs.accum")


def test_a_plain_script_whose_flags_carry_a_batch_size_no_role_names_is_told_at_submit(
    gw: DaemonHandle,
) -> None:
    """Step 1 said before the first out-of-memory: the flag that looks like the batch size, and
    the role that names it."""
    argv = ["--", sys.executable, "-c", "pass", "--train-batch-size", "64"]
    told = gw.cli("run", "--gpus", "0", "--name", "unnamed", *argv)
    assert told.returncode == 0, told.stderr
    assert told.stderr == (
        "warning: nothing names the micro-batch, so an out-of-memory stops the run — if "
        "--train-batch-size sets the micro-batch, add --role micro_batch=train-batch-size (and --role "
        "accum_steps=… where the script accumulates gradients), or command.roles in a spec\n"
    )
    named = gw.cli("run", "--gpus", "0", "--name", "named", "--role", "micro_batch=train-batch-size", *argv)
    assert named.returncode == 0 and named.stderr == "", named.stderr
