"""Which environment an attempt gets: the one the run was submitted with (else the daemon's), the
spec's `env` and a retune's on top, the daemon's placement and tag over everything."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.daemon.process import RUN_TAG, run_tag
from gpuwarden.daemon.supervise import AttemptEnd, Hooks, NextAttempt, RetuneNotes
from tests.supervise.conftest import Rig, command

SHELL = {
    "PATH": "/home/me/venv/bin:/usr/bin",
    "FOO": "shell",
    "BAR": "shell",
    "CUDA_VISIBLE_DEVICES": "7",
    # What a `gpuwarden run` typed inside a rank of another supervised run inherits from it.
    RUN_TAG: "outer/1",
    "GPUWARDEN_RESUME_FROM": "/outer/checkpoints/00000100",
    "GPUWARDEN_EVENTS_FILE": "/outer/events.jsonl",
    "RANK": "1",
    "WORLD_SIZE": "2",
}


def test_an_attempt_starts_from_the_submitted_environment_not_the_daemons(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONLY_THE_DAEMONS", "1")
    run_id = rig.submit(command(env={"FOO": "spec"}), environment=SHELL)
    rig.step()
    env = rig.proc_of(run_id).env
    assert env["PATH"] == SHELL["PATH"] and env["BAR"] == "shell"
    assert env["FOO"] == "spec"  # the spec's env over the shell's
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0" and env[RUN_TAG] == run_tag(run_id, 1)  # the daemon's
    assert env["GPUWARDEN_RESUME_FROM"] == "" and "/outer" not in env["GPUWARDEN_EVENTS_FILE"]
    assert "RANK" not in env and "WORLD_SIZE" not in env
    assert "ONLY_THE_DAEMONS" not in env


def test_a_run_submitted_without_one_starts_from_the_daemons(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    assert rig.proc_of(run_id).env["PATH"] == os.environ["PATH"]


class AllocatorRetune:
    """A retune that sets an allocator option in the spec's env, as the daemon's policy does."""

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes,
    ) -> NextAttempt | None:
        spec = {
            **run["spec"],
            "env": {**run["spec"]["env"], "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        }
        return NextAttempt(spec=spec, from_={}, to={"env": spec["env"]})


def test_a_retuned_and_a_restarted_attempt_keep_the_submitted_environment(rig: Rig) -> None:
    rig.use(Hooks(retune=AllocatorRetune()))
    run_id = rig.submit(command(on_interrupt="resume"), environment=SHELL)
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("oom", verdict="gpu_capacity", message="CUDA out of memory")
    proc.exit(EXIT_OOM)
    rig.step(2)  # the hook decides, then the loop starts attempt 2
    env = rig.proc_of(run_id).env
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and env["BAR"] == "shell"
    rig.proc_of(run_id).exit(sig=9, recorded=False)  # the whole group went, its recorder too
    rig.restart()  # a new supervisor, as after a daemon restart, resumes the interrupted run
    rig.step()
    assert rig.run(run_id)["attempt"] == 3
    env = rig.proc_of(run_id).env
    assert env["BAR"] == "shell" and env["PATH"] == SHELL["PATH"] and env[RUN_TAG] == run_tag(run_id, 3)
