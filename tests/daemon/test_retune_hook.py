"""The OOM seam: an attempt ending out of memory goes to the RetuneHook; its decision starts a new
attempt with the new spec, and no decision fails the run. Driven in-process, without a server."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.paths import Paths
from gpuwarden.core.run_state import FINAL_STATES
from gpuwarden.core.store.runs import RunStore
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.stream import Broadcaster
from gpuwarden.daemon.supervisor import AttemptEnd, RetuneDecision, Supervisor, no_retune
from gpuwarden.daemon.writer import StoreWriter

GIB = 1024**3
# Exits 3 (EXIT_OOM) with an `oom` event unless its batch knob is at most 4.
OOM_UNLESS_SMALL = (
    "import json, sys, time\n"
    "bs, events = int(sys.argv[1]), sys.argv[2]\n"
    "if bs > 4:\n"
    "    event = {{'v': 1, 'type': 'oom', 'ts': time.time(), 'verdict': 'gpu_capacity',\n"
    "             'message': 'CUDA out of memory', 'batch_size': bs}}\n"
    "    open(events, 'a').write(json.dumps(event) + '\\n')\n"
    "    sys.exit(3)\n"
    "print('ok at', bs)\n"
)


class Halving:
    """A stand-in for the OOM recovery policy: halve the `bs` knob, and record what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, AttemptEnd, list[str]]] = []

    def __call__(
        self, run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]]
    ) -> RetuneDecision | None:
        mine = [e["type"] for e in events if e["attempt"] == end.number]
        self.calls.append((run["id"], end, mine))
        spec = dict(run["spec"])
        old = spec["knobs"]["bs"]
        spec["knobs"] = {**spec["knobs"], "bs": old // 2}
        return RetuneDecision(spec=spec, from_={"bs": old}, to={"bs": old // 2}, verdict="gpu_capacity")


@pytest.fixture
def make_supervisor(tmp_path: Path) -> Iterator[Any]:
    writers: list[StoreWriter] = []

    def make(hook: Any) -> Supervisor:
        paths = Paths(
            state_dir=tmp_path / "state", runtime_dir=tmp_path / "run", db=tmp_path / "state" / "t.db"
        )
        paths.runs_dir.mkdir(parents=True)
        writer = StoreWriter(paths.db)
        writer.start()
        writers.append(writer)
        gpus = [GpuState("GPU-0", 0, 80 * GIB, 0)]
        return Supervisor(Settings(), paths, writer, lambda: gpus, Broadcaster(), retune_hook=hook)

    yield make
    for writer in writers:
        writer.stop()


def _drive(sup: Supervisor, run_id: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sup.lock:
            sup.step()
        run = sup.writer.call(lambda db: RunStore(db).get_run(run_id))
        assert run is not None
        if run["state"] in FINAL_STATES:
            return run
        time.sleep(0.05)
    raise AssertionError("run did not finish")


def _spec() -> Any:
    return spec_from_mapping(
        {
            "name": "oomy",
            "kind": "command",
            "command": {"argv": [sys.executable, "-c", OOM_UNLESS_SMALL, "{bs}", "{events_file}"]},
            "knobs": {"bs": 16},
        }
    )


def test_oom_attempts_are_retuned_until_the_run_fits(make_supervisor: Any) -> None:
    hook = Halving()
    sup = make_supervisor(hook)
    run = sup.submit(_spec())
    done = _drive(sup, run["id"])
    assert done["state"] == "succeeded", done["message"]
    assert done["attempt"] == 3 and done["spec"]["knobs"]["bs"] == 4
    ends = [c[1] for c in hook.calls]
    assert [(e.number, e.outcome, e.exit_code) for e in ends] == [(1, "oom", 3), (2, "oom", 3)]
    assert all(e.gpu_capacity == 80 * GIB and e.gpus == ["GPU-0"] and e.host_capacity for e in ends)
    assert all("oom" in c[2] for c in hook.calls)
    retunes = sup.writer.call(lambda db: RunStore(db).retunes(run["id"]))
    assert [(r["from"], r["to"], r["outcome"]) for r in retunes] == [
        ({"bs": 16}, {"bs": 8}, "oom"),
        ({"bs": 8}, {"bs": 4}, "succeeded"),
    ]
    states = [
        e["state"] for e in sup.writer.call(lambda db: RunStore(db).events(run["id"])) if e["type"] == "state"
    ]
    assert states.count("retuning") == 2
    assert states[-3:] == ["starting", "running", "succeeded"]


def test_command_oom_is_recognised_from_stderr(make_supervisor: Any) -> None:
    hook = Halving()
    sup = make_supervisor(hook)
    code = (
        "import sys\n"
        "if int(sys.argv[1]) > 8:\n"
        "    sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n')\n"
        "    sys.exit(1)\n"
    )
    spec = spec_from_mapping(
        {
            "name": "cmd",
            "kind": "command",
            "command": {"argv": [sys.executable, "-c", code, "{bs}"]},
            "knobs": {"bs": 16},
        }
    )
    done = _drive(sup, sup.submit(spec)["id"])
    assert done["state"] == "succeeded", done["message"]
    assert hook.calls[0][1].exit_code == 1 and "CUDA out of memory" in hook.calls[0][1].stderr_tail


def test_without_a_retune_the_oom_run_fails(make_supervisor: Any) -> None:
    sup = make_supervisor(no_retune)
    run = sup.submit(_spec())
    done = _drive(sup, run["id"])
    assert done["state"] == "failed"
    assert "out of memory" in done["message"]
