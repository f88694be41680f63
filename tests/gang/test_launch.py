"""The torchrun command of a gang attempt: argv for built-in runners and users' scripts, the
environment, and the spec rules that tie world size to GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.spec import parse_spec, spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.gang.launch import (
    Program,
    gang_launch,
    gang_size,
    program_from_argv,
    runner_program,
    threads_per_rank,
    uses_torchrun,
)

ATTEMPT = Path("/runs/r1/attempts/3")
PY = "/venv/bin/python"
TORCHRUN = [
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nnodes",
    "1",
    "--nproc-per-node",
]


def train_spec(world_size: int, **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "g",
        "kind": "train",
        "train": {"task": "image", "world_size": world_size},
    }
    if resources:
        spec["resources"] = resources
    return spec


def command_spec(argv: list[str], gpus: int | list[str] = 2, **extra: Any) -> dict[str, Any]:
    return {
        "name": "c",
        "kind": "command",
        "resources": {"gpus": gpus},
        "command": {"argv": argv, "launcher": "torchrun", **extra},
    }


def test_builtin_runner_runs_as_a_module_under_torchrun_with_one_rank_per_gpu() -> None:
    spec = spec_from_mapping(train_spec(2))
    program = runner_program(PY, ATTEMPT / "resolved.yaml", Path("/runs/r1"), 3)
    launch = gang_launch(spec, program, ["GPU-a", "GPU-b"], attempt_dir=ATTEMPT, python=PY, cpu_count=16)
    assert launch.argv[: 1 + len(TORCHRUN)] == [PY, *TORCHRUN]
    assert launch.argv[launch.argv.index("--nproc-per-node") + 1] == "2"
    assert launch.argv[launch.argv.index("--max-restarts") + 1] == "0"
    assert launch.argv[launch.argv.index("--log-dir") + 1] == str(ATTEMPT / "ranks")
    tail = ["-m", "gpuwarden.runners", "--spec", str(ATTEMPT / "resolved.yaml"), "--run-dir", "/runs/r1"]
    assert launch.argv[-len(tail) - 2 :] == [*tail, "--attempt", "3"]
    assert launch.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "TORCHELASTIC_ERROR_FILE": str(ATTEMPT / "torchrun-error.json"),
        "OMP_NUM_THREADS": "8",
    }
    assert launch.world_size == 2 and launch.log_dir == ATTEMPT / "ranks"


def test_cpu_ranks_hide_every_gpu_and_share_the_cores() -> None:
    spec = spec_from_mapping(train_spec(4, gpus=0))
    launch = gang_launch(
        spec, runner_program(PY, ATTEMPT, ATTEMPT, 1), [], attempt_dir=ATTEMPT, python=PY, cpu_count=2
    )
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "" and launch.env["OMP_NUM_THREADS"] == "1"
    assert threads_per_rank(16, 3) == 5 and threads_per_rank(0, 2) == 1


def test_the_spec_sets_omp_threads_itself() -> None:
    doc = train_spec(2)
    doc["env"] = {"OMP_NUM_THREADS": "3"}
    launch = gang_launch(
        spec_from_mapping(doc),
        runner_program(PY, ATTEMPT, ATTEMPT, 1),
        ["a", "b"],
        attempt_dir=ATTEMPT,
        python=PY,
        cpu_count=16,
    )
    assert "OMP_NUM_THREADS" not in launch.env


def test_placement_must_give_one_gpu_per_rank() -> None:
    spec = spec_from_mapping(train_spec(2))
    with pytest.raises(ValueError, match="2 ranks need 2 GPUs, 1 were placed"):
        gang_launch(
            spec, runner_program(PY, ATTEMPT, ATTEMPT, 1), ["a"], attempt_dir=ATTEMPT, python=PY, cpu_count=4
        )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--lr", "1e-4"], Program("train.py", ("--lr", "1e-4"), python="python")),
        (
            ["/opt/env/bin/python3.11", "-m", "pkg.train", "x"],
            Program("pkg.train", ("x",), "/opt/env/bin/python3.11", True),
        ),
        (["train.py", "--epochs", "3"], Program("train.py", ("--epochs", "3"), python=PY)),
        (["./trainer", "--fast"], Program("./trainer", ("--fast",))),
    ],
)
def test_users_command_lines_as_torchrun_takes_them(argv: list[str], expected: Program) -> None:
    assert program_from_argv(argv, PY) == expected


def test_a_users_script_runs_under_its_own_interpreter() -> None:
    spec = spec_from_mapping(command_spec(["/opt/env/bin/python", "train.py", "--bs", "8"]))
    program = program_from_argv(spec.command.argv, PY)  # type: ignore[union-attr]
    launch = gang_launch(spec, program, ["a", "b"], attempt_dir=ATTEMPT, python=PY, cpu_count=8)
    assert launch.argv[0] == "/opt/env/bin/python" and launch.argv[-3:] == ["train.py", "--bs", "8"]
    assert "--no-python" not in launch.argv and "-m" not in launch.argv[launch.argv.index("--tee") :]
    binary = gang_launch(
        spec, program_from_argv(["./trainer"], PY), ["a", "b"], attempt_dir=ATTEMPT, python=PY, cpu_count=8
    )
    assert binary.argv[0] == PY and binary.argv[-2:] == ["--no-python", "./trainer"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["torchrun", "--nproc-per-node", "2", "train.py"], "starts torchrun itself"),
        (["python", "-m", "torch.distributed.run", "train.py"], "starts torchrun itself"),
        (["python", "-u", "train.py"], "interpreter option '-u'"),
        (["python"], "no script"),
        (["python", "-m"], "needs a module name"),
    ],
)
def test_command_lines_torchrun_cannot_take_are_refused_with_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        program_from_argv(argv, PY)


def test_gang_size_and_which_runs_use_torchrun() -> None:
    assert gang_size(spec_from_mapping(train_spec(3))) == 3 and uses_torchrun(
        spec_from_mapping(train_spec(3))
    )
    assert not uses_torchrun(spec_from_mapping(train_spec(1)))
    assert gang_size(spec_from_mapping(command_spec(["t.py"], gpus=["0", "1", "2"]))) == 3
    assert uses_torchrun(spec_from_mapping(command_spec(["t.py"], gpus=1)))
    plain = {"name": "p", "kind": "command", "command": {"argv": ["t.py"]}}
    assert gang_size(spec_from_mapping(plain)) == 1 and not uses_torchrun(spec_from_mapping(plain))


def test_world_size_sets_the_gpu_count_when_the_spec_does_not() -> None:
    assert spec_from_mapping(train_spec(2)).resources.gpus == 2
    assert spec_from_mapping(train_spec(2, gpus=0)).resources.gpus == 0  # CPU ranks
    assert spec_from_mapping(train_spec(2, gpus=["0", "1"])).resources.gpus == ["0", "1"]


def test_a_two_rank_run_on_a_one_gpu_spec_is_refused_in_one_line_naming_both_numbers() -> None:
    text = "name: g\nkind: train\nresources: {gpus: 1}\ntrain: {task: image, world_size: 2}\n"
    with pytest.raises(UserError) as err:
        parse_spec(text, "spec.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert "world_size 2" in message and "asks for 1" in message and "resources.gpus: 2" in message
    with pytest.raises(UserError, match="asks for 1"):
        spec_from_mapping(train_spec(2, gpus=["GPU-a"]))


def test_a_torchrun_command_needs_gpus_or_says_so() -> None:
    with pytest.raises(UserError, match=r"resources\.gpus is 0"):
        spec_from_mapping(command_spec(["t.py"], gpus=0))
    with pytest.raises(UserError, match="launcher"):
        spec_from_mapping(command_spec(["t.py"], launcher="mpirun"))
