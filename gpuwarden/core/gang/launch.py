"""The `torch.distributed.run` (torchrun) command line and environment of a multi-process attempt.

One torchrun process per attempt starts the ranks on this machine: standalone rendezvous (a free
local port, so gangs never collide) — or, for a run over several machines, one torchrun per
machine with a c10d rendezvous on the first (`NodeRole`) — `--max-restarts 0` (the daemon owns
the restart budget: a restart needs a retune, which torchrun cannot do), per-rank logs and error
files in the attempt directory, each rank's output also copied to torchrun's own stdout/stderr
with a rank prefix.

Built-in runners:  PYTHON -m torch.distributed.run … -m gpuwarden.runners --spec … --run-dir … --attempt N
A user's script:   PYTHON -m torch.distributed.run … train.py ARGS…   (`command.launcher: torchrun`)

Pure functions: the caller passes the interpreter, the CPU count and the chosen GPUs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.gang.files import node_error_file, node_log_dir

TORCHRUN_MODULE = "torch.distributed.run"
RUNNERS_MODULE = "gpuwarden.runners"
# How often torchrun polls its workers: it notices a dead rank within this (its default in recent
# torch, given explicitly because older releases polled every 5 s).
MONITOR_INTERVAL_S = 0.1
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")


@dataclass(frozen=True)
class Program:
    """What every rank runs: a Python module or script (under `python`), or another program."""

    target: str  # module name, script path, or executable
    args: tuple[str, ...] = ()
    python: str | None = None  # the interpreter; None for a program that is not Python
    module: bool = False


@dataclass(frozen=True)
class GangLaunch:
    """The torchrun process of one attempt: argv, the environment it adds, and its ranks."""

    argv: list[str]
    env: dict[str, str]  # applied over the run's environment (the spec's env included)
    world_size: int
    log_dir: Path  # torchrun's --log-dir: per-rank stdout/stderr/error.json (see files.py)


@dataclass(frozen=True)
class NodeRole:
    """This machine's part in a run over several: its rank among the machines, and where the
    ranks meet (the first machine's address and a port free there, one rendezvous per attempt)."""

    nodes: int
    node_rank: int
    endpoint: str  # host:port of the c10d rendezvous, on node 0
    rendezvous_id: str  # the run and attempt: an attempt's ranks never meet a stale one's


def uses_torchrun(spec: RunSpec) -> bool:
    """Whether the run starts through torchrun: a training run with world_size > 1, or a command
    with `launcher: torchrun`."""
    if spec.kind == "train" and spec.train is not None:
        return spec.train.world_size > 1
    return spec.kind == "command" and spec.command is not None and spec.command.launcher == "torchrun"


def gang_size(spec: RunSpec) -> int:
    """Processes the run starts on all its machines: train.world_size, the GPUs asked for by a
    torchrun command on each machine, else 1."""
    if spec.kind == "train" and spec.train is not None:
        return spec.train.world_size
    if uses_torchrun(spec):
        gpus = spec.resources.gpus
        return (len(gpus) if isinstance(gpus, list) else max(1, gpus)) * spec.resources.nodes
    return 1


def ranks_per_node(spec: RunSpec) -> int:
    """Processes the run starts on each of its machines."""
    return gang_size(spec) // spec.resources.nodes


def runner_program(python: str, resolved_spec: Path, run_dir: Path, attempt: int) -> Program:
    """gpuwarden's own runner for one attempt (the launch contract of `gpuwarden.runners`)."""
    args = ("--spec", str(resolved_spec), "--run-dir", str(run_dir), "--attempt", str(attempt))
    return Program(RUNNERS_MODULE, args, python=python, module=True)


def program_from_argv(argv: Sequence[str], python: str) -> Program:
    """A user's command line as torchrun takes it. `[python, train.py, …]` runs under that
    interpreter, `[python, -m, pkg, …]` as a module, `[train.py, …]` under `python`, anything
    else as a program of its own (`--no-python`). Raises UserError for what torchrun cannot pass."""
    if not argv:
        raise UserError("command.argv is empty — name the training script")
    head = os.path.basename(argv[0])
    if head in ("torchrun", "torch.distributed.run") or list(argv[1:3]) == ["-m", TORCHRUN_MODULE]:
        raise UserError(
            "command.argv starts torchrun itself, and `launcher: torchrun` adds it — "
            "give argv the training script only, e.g. [python, train.py, …]"
        )
    if _PYTHON_RE.match(head):
        rest = list(argv[1:])
        if not rest:
            raise UserError("command.argv names the interpreter but no script — e.g. [python, train.py]")
        if rest[0] == "-m":
            if len(rest) < 2:
                raise UserError("command.argv: `-m` needs a module name — e.g. [python, -m, mypkg.train]")
            return Program(rest[1], tuple(rest[2:]), python=argv[0], module=True)
        if rest[0].startswith("-"):
            raise UserError(
                f"command.argv: the interpreter option {rest[0]!r} cannot be passed through torchrun "
                "(which runs Python unbuffered) — remove it, or set it in PYTHON* variables under env"
            )
        return Program(rest[0], tuple(rest[1:]), python=argv[0])
    if head.endswith(".py"):
        return Program(argv[0], tuple(argv[1:]), python=python)
    return Program(argv[0], tuple(argv[1:]))


def torchrun_argv(
    program: Program, nproc: int, log_dir: Path, python: str, node: NodeRole | None = None
) -> list[str]:
    """`PYTHON -m torch.distributed.run` options for `nproc` ranks on this machine, then `program`.

    `python` runs torchrun when the program is not Python; a Python program's own interpreter
    runs both (its torch is the one the ranks use). With `node`, this machine's torchrun meets the
    others' at the rendezvous on the first machine.
    """
    if nproc < 1:
        raise ValueError(f"a gang needs at least one rank, not {nproc}")
    argv = [program.python or python, "-m", TORCHRUN_MODULE, *_rendezvous(node)]
    argv += [
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--monitor-interval",
        str(MONITOR_INTERVAL_S),
        "--log-dir",
        str(log_dir),
        "--tee",
        "3",
    ]
    if program.python is None:
        argv.append("--no-python")
    elif program.module:
        argv.append("-m")
    return [*argv, program.target, *program.args]


def _rendezvous(node: NodeRole | None) -> list[str]:
    if node is None:
        return ["--standalone", "--nnodes", "1"]
    return [
        "--nnodes",
        str(node.nodes),
        "--node-rank",
        str(node.node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        node.endpoint,
        "--rdzv-id",
        node.rendezvous_id,
        # Only the first machine serves the rendezvous, whatever the others' names resolve to
        # (two "machines" on one host in a test; a host whose name is also the endpoint's).
        "--rdzv-conf",
        f"is_host={'true' if node.node_rank == 0 else 'false'}",
    ]


def threads_per_rank(cpu_count: int, nproc: int) -> int:
    """CPU threads each rank's OpenMP pool gets: the CPUs shared out, at least one."""
    return max(1, cpu_count // max(1, nproc))


def gang_env(gpus: Sequence[str], nproc: int, attempt_dir: Path, node_rank: int = 0) -> dict[str, str]:
    """Variables torchrun and its ranks must get whatever the run's environment says.

    The chosen GPUs by UUID in PCI bus order (local rank N uses the N-th; none = CPU ranks), and
    where this machine's torchrun writes its failure summary.
    """
    if gpus and len(gpus) != nproc:
        raise ValueError(f"{nproc} ranks need {nproc} GPUs, {len(gpus)} were placed")
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
        "TORCHELASTIC_ERROR_FILE": str(node_error_file(attempt_dir, node_rank)),
    }


def gang_launch(
    spec: RunSpec,
    program: Program,
    gpus: Sequence[str],
    *,
    attempt_dir: Path,
    python: str,
    cpu_count: int,
    node: NodeRole | None = None,
) -> GangLaunch:
    """The torchrun command of one attempt of `spec` on `gpus` (UUIDs; empty = CPU ranks), on
    this machine (`node`: which of the run's machines it is, when there are several).

    `program` is `runner_program(...)` for built-in runners, `program_from_argv(rendered argv)`
    for a command. OMP_NUM_THREADS defaults to the CPUs shared out between the ranks (torchrun
    would set 1) unless the spec sets it.
    """
    nproc = ranks_per_node(spec)
    node_rank = node.node_rank if node is not None else 0
    log_dir = node_log_dir(attempt_dir, node_rank)
    user_env: Mapping[str, str] = {**spec.env, **(spec.command.env if spec.command else {})}
    env = gang_env(gpus, nproc, attempt_dir, node_rank)
    if "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = str(threads_per_rank(cpu_count, nproc))
    argv = torchrun_argv(program, nproc, log_dir, python, node)
    return GangLaunch(argv, env, gang_size(spec), log_dir)
