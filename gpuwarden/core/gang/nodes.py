"""How the machines of a run over several talk: files in the run's folder, which every machine
mounts (the folder a cluster job's run lives in is on a shared file system).

The first machine's `gpuwarden exec` (the leader) supervises the run: it keeps the store, decides
every retune, and writes, before each attempt, what the other machines start (`NodePlan`, in
`attempts/<N>/nodes.json`). Each other machine's exec (a follower) starts its torchrun from that
plan, passes on the signals the leader writes for the attempt (`attempts/<N>/nodes.signal`), and
records how its torchrun ended (`attempts/<N>/node<K>.exit.json`, the exit recorder's file). The
leader says it is alive, and how the run ended, in `nodes/leader.json`.

One writer per file, each replaced whole (written aside, then renamed): a reader on another
machine sees the old content or the new, never half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ValidationError

from gpuwarden.core.gang.files import node_log_dir
from gpuwarden.core.gang.launch import NodeRole, Program, gang_env, threads_per_rank, torchrun_argv

PLAN_NAME = "nodes.json"
SIGNAL_NAME = "nodes.signal"
LEADER_FILE = Path("nodes") / "leader.json"
M = TypeVar("M", bound=BaseModel)
# The signals the leader passes on to the other machines' torchrun (and nothing else).
Forwarded = Literal["SIGTERM", "SIGKILL"]


class PlannedProgram(BaseModel):
    """What every rank runs (`launch.Program`), as the plan carries it."""

    target: str
    args: list[str]
    python: str | None
    module: bool


class NodePlan(BaseModel):
    """One attempt as every other machine starts it: the same program, the same rendezvous."""

    leader: str  # the leader's token: a plan of an exec that is gone is never started
    attempt: int
    nodes: int
    ranks_per_node: int
    endpoint: str
    rendezvous_id: str
    program: PlannedProgram
    leader_python: str  # the leader's interpreter: a follower runs its own instead
    env: dict[str, str]  # what the run adds to a machine's own environment
    cwd: str
    memory_limit: int | None
    cpu_ranks: bool  # the ranks run on the CPU (no machine gives them a GPU)
    run_id: str


class LeaderBeat(BaseModel):
    """The leader's heartbeat: its token, a count it raises every second, and the run's end."""

    token: str
    beat: int
    run_id: str = ""
    exit_code: int | None = None  # set once, when the leader's exec ends


def plan_path(attempt_dir: Path) -> Path:
    return attempt_dir / PLAN_NAME


def signal_path(attempt_dir: Path) -> Path:
    return attempt_dir / SIGNAL_NAME


def node_exit_path(attempt_dir: Path, node_rank: int) -> Path:
    """Where machine `node_rank`'s exit recorder writes how its torchrun ended."""
    return attempt_dir / f"node{node_rank}.exit.json"


def node_output(attempt_dir: Path, node_rank: int) -> tuple[Path, Path]:
    """Machine `node_rank`'s torchrun stdout and stderr (the first machine's are the attempt's)."""
    return attempt_dir / f"node{node_rank}.stdout.log", attempt_dir / f"node{node_rank}.stderr.log"


def write_whole(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename (see the module's docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    aside.write_text(text, encoding="utf-8")
    os.replace(aside, path)


def read_plan(attempt_dir: Path) -> NodePlan | None:
    """The attempt's plan; None when there is none (yet) or it cannot be read."""
    return _read(plan_path(attempt_dir), NodePlan)


def read_beat(run_dir: Path) -> LeaderBeat | None:
    return _read(run_dir / LEADER_FILE, LeaderBeat)


def read_signal(attempt_dir: Path) -> Forwarded | None:
    try:
        text = signal_path(attempt_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if text == "SIGTERM":
        return "SIGTERM"
    if text == "SIGKILL":
        return "SIGKILL"
    return None


def _read(path: Path, model: type[M]) -> M | None:
    try:
        if path.stat().st_size > 1 << 20:  # written by gpuwarden: never this large
            return None
        return model.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None


def node_command(
    plan: NodePlan, node_rank: int, attempt_dir: Path, python: str, cpu_count: int
) -> tuple[list[str], dict[str, str]]:
    """Machine `node_rank`'s torchrun for `plan`: its argv, and what goes over that machine's own
    environment (the run's variables, this machine's files; CPU ranks see no GPU, GPU ranks the
    GPUs the machine's job gives them). `python` is this machine's interpreter."""
    given = plan.program
    own_python = python if given.python in (None, plan.leader_python) else given.python
    program = Program(given.target, tuple(given.args), own_python if given.python else None, given.module)
    role = NodeRole(plan.nodes, node_rank, plan.endpoint, plan.rendezvous_id)
    log_dir = node_log_dir(attempt_dir, node_rank)
    argv = torchrun_argv(program, plan.ranks_per_node, log_dir, python, role)
    env = dict(plan.env)
    env.update(gang_env([], plan.ranks_per_node, attempt_dir, node_rank))
    if not plan.cpu_ranks:
        del env["CUDA_VISIBLE_DEVICES"]
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(cpu_count, plan.ranks_per_node)))
    return argv, env
