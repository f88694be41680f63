"""`autotune: true`: the run's GPUs are held while the hook probes; the tuned spec starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command, train


class Tuner:
    """Halves the micro-batch and doubles accumulation (the effective batch kept)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, list[str], Path]] = []

    def __call__(self, spec: RunSpec, gpus: list[str], run_dir: Path) -> tuple[dict[str, Any], str]:
        self.calls.append((spec.name, gpus, run_dir))
        if self.fail:
            raise RuntimeError("probe crashed\nwith a second line")
        doc = spec.model_dump(mode="json")
        doc["train"].update(batch_size=8, grad_accum_steps=2)
        doc["autotune"] = False
        return doc, "autotune (probed): batch 8 × 2"


def _resolved(rig: Rig, run_id: str, attempt: int = 1) -> dict[str, Any]:
    path = Path(rig.run(run_id)["run_dir"]) / "attempts" / str(attempt) / "resolved.yaml"
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_autotune_probes_on_the_run_gpus_then_starts_the_tuned_spec(rig: Rig) -> None:
    tuner = Tuner()
    rig.use(Hooks(autotune=tuner))
    rig.workers.hold = True
    run_id = rig.submit(train(autotune=True))
    rig.step()
    assert rig.state(run_id) == RunState.STARTING and rig.procs.spawned == []
    assert rig.run(run_id)["message"] == "autotune: probing micro-batch sizes on GPU-0"
    assert rig.sup.ctx.held == {run_id: ["GPU-0"]}
    rig.workers.release()
    rig.step()
    assert tuner.calls == [("tr", ["GPU-0"], Path(rig.run(run_id)["run_dir"]))]
    assert rig.state(run_id) == RunState.RUNNING and rig.sup.ctx.held == {}
    train_doc = _resolved(rig, run_id)["train"]
    assert (train_doc["batch_size"], train_doc["grad_accum_steps"]) == (8, 2)
    assert rig.proc_of(run_id).env["CUDA_VISIBLE_DEVICES"] == "GPU-0"
    assert [e["message"] for e in rig.events(run_id, "autotuned")] == ["autotune (probed): batch 8 × 2"]
    assert rig.run(run_id)["spec"]["autotune"] is False  # tuned once; a resume starts from here


def test_a_failed_autotune_starts_the_run_as_written(rig: Rig) -> None:
    rig.use(Hooks(autotune=Tuner(fail=True)))
    run_id = rig.submit(train(autotune=True))
    rig.step(2)
    assert rig.state(run_id) == RunState.RUNNING
    assert _resolved(rig, run_id)["train"]["batch_size"] == 16
    (event,) = rig.events(run_id, "autotuned")
    assert event["message"] == (
        "autotune failed (probe crashed; with a second line); starting with the spec's own values"
    )


def test_a_run_stopped_while_probing_does_not_start(rig: Rig) -> None:
    rig.use(Hooks(autotune=Tuner()))
    rig.workers.hold = True
    run_id = rig.submit(train(autotune=True))
    rig.step()
    rig.sup.stop_run(run_id)
    rig.workers.release()
    rig.step()
    assert rig.state(run_id) == RunState.STOPPED and rig.procs.spawned == []
    assert rig.sup.ctx.held == {}


def test_tune_run_resumes_a_stopped_run_through_the_autotune(rig: Rig) -> None:
    tuner = Tuner()
    rig.use(Hooks(autotune=tuner))
    run_id = rig.submit(train())
    rig.step()
    rig.sup.stop_run(run_id, grace=0)
    rig.step(2)
    assert rig.state(run_id) == RunState.STOPPED
    tuned = rig.sup.tune_run(run_id)
    assert tuned["state"] == RunState.QUEUED and tuned["spec"]["autotune"] is True
    rig.step(2)
    assert len(tuner.calls) == 1 and rig.run(run_id)["attempt"] == 2
    assert _resolved(rig, run_id, 2)["train"]["batch_size"] == 8


def test_without_an_autotune_hook_the_run_starts_as_written(rig: Rig) -> None:
    run_id = rig.submit(train(autotune=True))
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and rig.workers.names == []
    assert rig.submit(command()) and rig.sup.ctx.held == {}
