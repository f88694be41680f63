"""The batch script `sbatch_script` writes, read as text (tests/slurm/test_jobs.py submits it)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.slurm.sbatch import SbatchOptions, format_time, sbatch_script


def _directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_every_option_is_one_directive_with_a_comment_above_it() -> None:
    options = SbatchOptions(
        job_name="fine tune",
        output="/runs/%j.out",
        time=timedelta(hours=4, minutes=30),
        nodes=1,
        ntasks_per_node=8,
        gpus_per_node=8,
        partition="gpu",
        requeue=True,
        open_mode_append=True,
        signal_lead_s=90,
        extra=("--qos", "high", "--account=ml", "-C", "a100 80gb"),
    )
    script = sbatch_script(options, ["python", "train.py", "--lr", "3e-4"])
    assert _directives(script) == [
        '--job-name="fine tune"',
        "--output=/runs/%j.out",
        "--open-mode=append",
        "--time=0-04:30:00",
        "--nodes=1",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--requeue",
        "--signal=B:USR1@90",
        "--qos high",
        "--account=ml",
        '-C "a100 80gb"',
    ]
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for index, line in enumerate(lines):
        if line.startswith("#SBATCH "):
            assert lines[index - 1].startswith("# "), f"no comment above {line!r}"
    assert lines[-1] == "exec python train.py --lr 3e-4"


def test_defaults_leave_the_cluster_to_decide() -> None:
    script = sbatch_script(SbatchOptions(), ["true"])
    assert _directives(script) == ["--nodes=1", "--ntasks-per-node=1"]
    assert script.endswith("\nexec true\n")


def test_arguments_are_quoted_for_bash() -> None:
    script = sbatch_script(SbatchOptions(), ["python", "-c", "print('a b'); print($HOME)"])
    assert script.splitlines()[-1] == "exec python -c 'print('\"'\"'a b'\"'\"'); print($HOME)'"


def test_several_nodes_run_one_copy_per_node_through_srun() -> None:
    script = sbatch_script(SbatchOptions(nodes=4, ntasks_per_node=8), ["torchrun", "train.py"])
    assert "--nodes=4" in _directives(script)
    # --ntasks from the job's own node count: srun would otherwise take nodes × ntasks-per-node.
    assert script.splitlines()[-1] == (
        'exec srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun train.py'
    )


def test_a_lead_leaving_more_than_a_time_limit_check_is_taken() -> None:
    options = SbatchOptions(time=timedelta(minutes=2), signal_lead_s=89)
    assert "--signal=B:USR1@89" in _directives(sbatch_script(options, ["true"]))
    with pytest.raises(UserError, match="signal lead 90 s leaves 30 s of the time limit"):
        SbatchOptions(time=timedelta(minutes=2), signal_lead_s=90)
    with pytest.raises(UserError, match="signal lead 200 s leaves 0 s of the time limit"):
        SbatchOptions(time=timedelta(minutes=2), signal_lead_s=200)


def test_time_is_days_hours_minutes_seconds() -> None:
    assert format_time(timedelta(minutes=1)) == "0-00:01:00"
    assert format_time(timedelta(days=2, hours=3, seconds=5)) == "2-03:00:05"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (lambda: SbatchOptions(nodes=0), "nodes is 0: give 1 or more"),
        (lambda: SbatchOptions(gpus_per_node=0), "gpus_per_node is 0: give 1 or more"),
        (lambda: SbatchOptions(job_name="a\nb"), "job_name 'a\\nb' holds a line break"),
        (lambda: SbatchOptions(output='x"y'), "output 'x\"y' holds a line break, NUL or double quote"),
        (lambda: SbatchOptions(partition=""), "partition is empty: give a value or leave it out"),
        (lambda: SbatchOptions(time=timedelta(0)), "time limit 0:00:00 is not positive"),
        (lambda: SbatchOptions(signal_lead_s=0), "signal lead 0 s is out of range: give 1 to 65535 seconds"),
        (
            lambda: SbatchOptions(time=timedelta(minutes=1), signal_lead_s=50),
            "signal lead 50 s leaves 10 s of the time limit 0-00:01:00: Slurm may send the signal up to 30 s"
            " early, before the command has started; give a time limit over lead + 30 s or a shorter lead",
        ),
        (lambda: SbatchOptions(extra=("qos=high",)), "'qos=high' is not an sbatch option"),
        (lambda: SbatchOptions(extra=("--qos", "high", "low")), "'low' is not an sbatch option"),
        (lambda: SbatchOptions(extra=("--qos=high", "low")), "'low' is not an sbatch option"),
        (
            lambda: SbatchOptions(extra=("--comment=a\nb",)),
            "sbatch option '--comment=a\\nb' holds a line break",
        ),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(options: object, message: str) -> None:
    with pytest.raises(UserError) as caught:
        options()  # type: ignore[operator]
    assert message in caught.value.message
    assert ": " in caught.value.message and "\n" not in caught.value.message


def test_a_command_is_needed_and_bash_cannot_carry_nul() -> None:
    with pytest.raises(UserError, match="no command for the job to run"):
        sbatch_script(SbatchOptions(), [])
    with pytest.raises(UserError, match="holds a NUL character"):
        sbatch_script(SbatchOptions(), ["echo", "a\0b"])


def test_a_run_over_two_nodes_is_written_as_one_exec_per_node(tmp_path: Path) -> None:
    """`slurm submit --nodes 2`: the spec the job runs says so, and srun starts an exec per node
    (each learns its rank from SLURM_NODEID). This one-node Slurm cannot run it: the text is
    what is checked here; tests/job/test_exec_nodes.py runs two execs for real."""
    from gpuwarden.cli.slurm_cmds import _write_folder
    from gpuwarden.core.config.spec import load_spec

    spec = load_spec_text(tmp_path, "resources: {gpus: 0, nodes: 2}\ntrain: {task: image, world_size: 4}\n")
    script = _write_folder(tmp_path / "run", spec, SbatchOptions(nodes=2), 3).read_text()
    assert "--nodes=2" in _directives(script)
    (launch,) = [line for line in script.splitlines() if line.startswith("exec srun ")]
    assert launch.endswith("--slurm-requeue 3 --nodes 2") and " exec " in launch
    written = load_spec(tmp_path / "run" / "job.yaml")
    assert (written.resources.nodes, written.resources.gpus, written.train and written.train.world_size) == (
        2,
        0,
        4,
    )


def load_spec_text(folder: Path, body: str) -> RunSpec:
    from gpuwarden.core.config.spec import load_spec

    path = folder / "spec.yaml"
    path.write_text(f"name: two-nodes\nkind: train\n{body}")
    return load_spec(path)
