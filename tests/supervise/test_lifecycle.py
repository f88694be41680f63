"""A run from the queue to its end, driven pass by pass with a fake process layer."""

from __future__ import annotations

import errno
import signal
from pathlib import Path

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command
from tests.supervise.test_retune import Halving


def test_queued_run_starts_runs_and_succeeds(rig: Rig) -> None:
    run_id = rig.submit(command(knobs={"bs": 16}))
    assert rig.state(run_id) == RunState.QUEUED
    rig.step()
    proc = rig.proc_of(run_id)
    assert rig.state(run_id) == RunState.RUNNING
    assert proc.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and proc.env["CUDA_VISIBLE_DEVICES"] == "GPU-0"
    assert proc.argv[-1] == str(proc.events_path)  # {events_file} rendered
    proc.emit("progress", step=1, samples_seen=16, loss=0.5)
    rig.step()
    assert [e["loss"] for e in rig.events(run_id, "progress")] == [0.5]
    proc.exit(0)
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.SUCCEEDED and run["message"] == "attempt 1: exit code 0"
    assert rig.states(run_id) == ["queued", "starting", "running", "succeeded"]
    (attempt,) = rig.attempts(run_id)
    assert (attempt["pid"], attempt["exit_code"], attempt["classification"]) == (proc.pid, 0, "succeeded")
    assert rig.sup.active == {}
    assert (Path(run["run_dir"]) / "attempts" / "1" / "resolved.yaml").exists()


def test_exit_code_fails_the_run_and_an_error_event_says_why(rig: Rig) -> None:
    plain = rig.submit(command("plain"))
    said = rig.submit(command("said"))
    rig.step()
    rig.proc_of(plain).exit(7)
    rig.proc_of(said).emit("error", message="ValueError: no such column 'label'")
    rig.proc_of(said).exit(1)
    rig.step()
    assert rig.run(plain)["state"] == RunState.FAILED and "exit code 7" in rig.run(plain)["message"]
    assert rig.run(said)["message"] == "attempt 1: ValueError: no such column 'label' (exit code 1)"


def test_a_programs_own_exit_codes_mean_nothing_more_and_its_last_stderr_line_says_why(rig: Rig) -> None:
    # gpuwarden's runners exit 3 after an out-of-memory and 2 for a spec that cannot be met; a
    # user's program may exit 3 or 2 for its own reasons.
    three, two = rig.submit(command("three")), rig.submit(command("two"))
    rig.step()
    rig.proc_of(three).write_stderr("loading data\n")
    rig.proc_of(three).exit(3)
    rig.proc_of(two).write_stderr(
        'Traceback (most recent call last):\n  File "train.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'torch'\n\n"
    )
    rig.proc_of(two).exit(2)
    rig.step()
    assert rig.run(three)["state"] == RunState.FAILED and rig.events(three, "retuned") == []
    assert rig.run(three)["message"] == "attempt 1: exit code 3 — last stderr line: loading data"
    assert rig.attempts(three)[0]["classification"] == "failed"
    assert (
        rig.run(two)["message"]
        == "attempt 1: exit code 2 — last stderr line: ModuleNotFoundError: No module named 'torch'"
    )


def test_a_hydra_scripts_failure_is_said_by_its_error_not_hydras_closing_hint(rig: Rig) -> None:
    run = rig.submit(command("hydra"))
    rig.step()
    rig.proc_of(run).write_stderr(
        "Error executing job with overrides: ['training.steps=oops']\nTraceback (most recent call last):\n"
        "TypeError: 'str' object cannot be interpreted as an integer\n\n"
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
    )
    rig.proc_of(run).exit(1)
    rig.step()
    assert rig.run(run)["message"] == (
        "attempt 1: exit code 1 — last stderr line: TypeError: 'str' object cannot be interpreted as an integer"
    )


def test_terminal_codes_in_what_a_program_wrote_do_not_reach_the_runs_message(rig: Rig) -> None:
    """Colours, a terminal title, a bell or a bidirectional override in a program's last words
    would repaint the terminal of whoever runs `gpuwarden ps`: the message is plain text."""
    coloured, said = rig.submit(command("coloured")), rig.submit(command("said"))
    rig.step()
    rig.proc_of(coloured).write_stderr(
        "epoch 1: 10%\repoch 1: 20%\n\x1b]0;pwned\x07\x1b[31mRuntimeError:\x1b[0m bad\tinput\x07\u202e!\n"
    )
    rig.proc_of(coloured).exit(1)
    rig.proc_of(said).emit("error", message="\x1b[2J\x1b[HValueError:\nno column\x1b[0m")
    rig.proc_of(said).exit(1)
    rig.step()
    assert (
        rig.run(coloured)["message"] == "attempt 1: exit code 1 — last stderr line: RuntimeError: bad input !"
    )
    assert rig.run(said)["message"] == "attempt 1: ValueError: no column (exit code 1)"


def test_a_memory_limit_too_small_to_load_libraries_says_so(rig: Rig) -> None:
    run_id = rig.submit(command(resources={"gpus": 1, "memory_limit": "300MiB"}))
    rig.step()
    rig.proc_of(run_id).write_stderr(
        "ImportError: /venv/lib/torch/lib/libtorch_cpu.so: failed to map segment from shared object\n"
    )
    rig.proc_of(run_id).exit(1)
    rig.step()
    assert rig.run(run_id)["message"] == (
        "attempt 1: resources.memory_limit (300 MiB) leaves no room to load the program's libraries"
        " — raise it (exit code 1)"
    )
    assert rig.events(run_id, "retuned") == []  # no micro-batch fixes that


def test_a_program_that_cannot_start_fails_with_one_line(rig: Rig) -> None:
    rig.procs.fail_with = FileNotFoundError(errno.ENOENT, "No such file or directory", "/nonexistent/x")
    run_id = rig.submit(command())
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED
    assert run["message"].startswith("cannot start ") and run["message"].endswith(
        ": No such file or directory"
    )
    (attempt,) = rig.attempts(run_id)
    assert attempt["state"] == "ended" and attempt["classification"] == "failed" and attempt["pid"] is None
    assert rig.sup.active == {}


def test_a_spec_that_no_longer_validates_fails_in_the_queue(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.writer.call(lambda db: db.conn.execute('UPDATE runs SET spec = \'{"kind": "nope"}\''))
    rig.step()
    assert rig.state(run_id) == RunState.FAILED
    assert rig.procs.spawned == []


def test_what_an_attempt_leaves_in_its_process_group_is_killed_when_it_ends(rig: Rig) -> None:
    tidy, messy = rig.submit(command("tidy")), rig.submit(command("messy"))
    rig.step()
    tidy_proc, messy_proc = rig.proc_of(tidy), rig.proc_of(messy)
    messy_proc.group_members = 2  # e.g. dataloader workers that outlive the main process
    tidy_proc.exit(0)
    messy_proc.exit(0)
    rig.step()
    assert tidy_proc.signals == []  # nothing left: nothing sent
    assert messy_proc.signals == [signal.SIGKILL] and not messy_proc.group_alive
    assert rig.state(messy) == RunState.SUCCEEDED


def test_pid_owners_map_process_groups_to_runs(rig: Rig) -> None:
    a, b = rig.submit(command("a")), rig.submit(command("b"))
    rig.step()
    owners = rig.sup.pid_owners()
    assert owners == {rig.proc_of(a).pid: a, rig.proc_of(b).pid: b}


def test_every_time_recorded_for_a_run_is_the_supervisors_clock_and_in_order(rig: Rig) -> None:
    rig.use(Hooks(retune=Halving()))
    submitted = rig.clock()
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.clock.advance(1)
    rig.step()  # attempt 1 starts
    rig.clock.advance(60)
    rig.proc_of(run_id).emit("oom", verdict="gpu_capacity")
    rig.proc_of(run_id).exit(EXIT_OOM)
    rig.step()  # it ends; the retune is decided
    rig.clock.advance(1)
    rig.step()  # attempt 2 starts
    rig.clock.advance(60)
    rig.proc_of(run_id).exit(0)
    rig.step()
    run, attempts = rig.run(run_id), rig.attempts(run_id)
    assert run["state"] == RunState.SUCCEEDED and len(attempts) == 2
    times = [run["created_at"], run["started_at"]]
    for attempt in attempts:
        times += [attempt["started_at"], attempt["ended_at"]]
    times += [run["ended_at"]]
    assert times == sorted(times) and times[0] == submitted and times[-1] == rig.clock()
    assert run["updated_at"] == run["ended_at"]
    daemon_said = [e["ts"] for e in rig.events(run_id) if e["source"] == "daemon"]
    assert daemon_said == sorted(daemon_said)
    assert daemon_said[0] == submitted and daemon_said[-1] == rig.clock()
    (retune,) = rig.retunes(run_id)
    assert attempts[0]["ended_at"] <= retune["ts"] <= attempts[1]["started_at"]
