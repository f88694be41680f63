"""Probes of a user's own program, with a small real program (no torch): each step holds
`batch × 40 MB`, so under an address-space limit a large micro-batch fails for real with
MemoryError. It reports nothing to gpuwarden: OOMs come from stderr and the exit status, peaks
from the process itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.command_probe import CommandProber, probe_blocker
from gpuwarden.core.tune.fingerprint import fingerprint, fingerprint_inputs
from gpuwarden.core.tune.search import Candidate
from gpuwarden.core.tune.session import tune_spec
from gpuwarden.core.tune.target import Target

MB = 1 << 20
LIMIT = 512 * MB

PROGRAM = """
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int); p.add_argument("--accum", type=int)
p.add_argument("--max_steps", type=int); p.add_argument("--out"); p.add_argument("--resume")
a = p.parse_args()
step = json.load(open(os.path.join(a.resume, "state.json")))["step"] if a.resume else 0
print(f"start at step {step}", flush=True)
while step < a.max_steps:
    for _ in range(a.accum):
        held = bytearray(a.batch * 40 * 2**20)
        held[:: 4096] = b"x" * len(held[:: 4096])
        del held
    step += 1
    os.makedirs(os.path.join(a.out, f"checkpoint-{step}"), exist_ok=True)
    json.dump({"step": step}, open(os.path.join(a.out, f"checkpoint-{step}", "state.json"), "w"))
print("done", flush=True)
"""


def _spec(tmp_path: Path, **roles: Any) -> RunSpec:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    command: dict[str, Any] = {
        "cwd": str(tmp_path),
        "argv": [
            "{python}", "train.py", "--batch", "{bs}", "--accum", "{acc}", "--max_steps", "{steps}",
            "--out", "{out}", "--resume", "{resume_from?}",
        ],
        "roles": roles or {"micro_batch": "bs", "accum_steps": "acc", "max_steps": "steps", "output_dir": "out"},
        "checkpoints": {"glob": "{out}/checkpoint-*", "complete_when": "state.json"},
    }  # fmt: skip
    return complete_command(
        spec_from_mapping(
            {
                "name": "mine",
                "kind": "command",
                "resources": {"gpus": 0, "memory_limit": LIMIT},
                "command": command,
                "knobs": {"bs": 16, "acc": 1, "steps": 100, "out": "outputs"},
            }
        )
    )


def test_a_probe_is_the_program_with_its_role_knobs_set(tmp_path: Path) -> None:
    prober = CommandProber(_spec(tmp_path), tmp_path / "probes", warmup_steps=1, measure_steps=1)
    too_big = prober(Candidate(16, 1, "auto", False))
    assert too_big.oom and not too_big.ok  # MemoryError on stderr, exit 1: read as out of memory
    fits = prober(Candidate(4, 4, "auto", False))
    assert fits.ok and fits.samples_per_s and fits.samples_per_s > 0
    assert fits.mem_peak is not None and 160 * MB < fits.mem_peak < LIMIT  # its VmPeak, read outside
    # Two steps (not the run's 100), written into the probe's folder, not the user's outputs/.
    assert not (tmp_path / "outputs").exists()
    written = sorted(p.name for p in (tmp_path / "probes" / "probe-2" / "output").iterdir())
    assert written == ["checkpoint-1", "checkpoint-2"]


def test_tune_of_a_program_keeps_its_effective_batch(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    target = Target({"type": "cpu", "name": "cpu", "memory_total": LIMIT}, LIMIT, {}, [], [])
    cache = TuneCache(tmp_path / "cache")
    outcome = tune_spec(spec, target, cache, tmp_path / "work", env=dict(os.environ))
    assert outcome.knobs == {"bs": 8, "acc": 2}  # 16 × 1 ran out of memory; 8 × 2 is the largest that fits
    trials = outcome.result["trials"]
    assert trials[0]["oom"] and trials[0]["candidate"]["batch_size"] == 16
    assert all(t["candidate"]["batch_size"] * t["candidate"]["grad_accum_steps"] == 16 for t in trials)
    again = tune_spec(spec, target, cache, tmp_path / "work", env={})
    assert again.cached and again.knobs == outcome.knobs


def test_the_fingerprint_follows_the_program_not_the_tuned_knobs(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    device = {"type": "cpu"}
    base = fingerprint(fingerprint_inputs(spec, device))
    tuned = spec.model_copy(update={"knobs": {**spec.knobs, "bs": 4, "acc": 4, "steps": 7}})
    assert fingerprint(fingerprint_inputs(tuned, device)) == base
    (tmp_path / "train.py").write_text(PROGRAM + "\n# changed\n")
    assert fingerprint(fingerprint_inputs(spec, device)) != base


@pytest.mark.parametrize(
    ("roles", "missing"),
    [
        ({"accum_steps": "acc"}, "command.roles.micro_batch"),
        ({"micro_batch": "bs"}, "command.roles.max_steps"),
        ({"micro_batch": "bs", "max_steps": "steps"}, "command.roles.output_dir"),
    ],
)
def test_what_a_probe_needs_is_named(tmp_path: Path, roles: dict[str, str], missing: str) -> None:
    blocker = probe_blocker(_spec(tmp_path, **roles))
    assert blocker is not None and missing in blocker


def test_a_checkpoint_pattern_under_the_run_folder_needs_no_output_role(tmp_path: Path) -> None:
    spec = _spec(tmp_path, micro_batch="bs", max_steps="steps")
    inside = spec.model_copy(update={"knobs": {**spec.knobs, "out": "{run_dir}/out"}})
    assert probe_blocker(inside) is None


def test_tune_refuses_what_it_cannot_keep(tmp_path: Path) -> None:
    target = Target({"type": "cpu"}, LIMIT, {}, [], [])
    cache = TuneCache(tmp_path / "cache")
    no_accum = _spec(tmp_path, micro_batch="bs", max_steps="steps", output_dir="out")
    with pytest.raises(UserError, match=r"command.roles.accum_steps"):
        tune_spec(no_accum, target, cache, tmp_path / "w", env={})
    with pytest.raises(UserError, match="learning rate"):
        tune_spec(_spec(tmp_path), target, cache, tmp_path / "w", env={}, change_effective_batch=True)


def test_an_energy_objective_is_refused_for_a_programs_probes(tmp_path: Path) -> None:
    # Said before anything else: even on a GPU with an energy counter these probes read no joules.
    target = Target({"type": "cpu"}, LIMIT, {}, [], [])
    with pytest.raises(UserError, match="probes of your own program measure throughput only"):
        tune_spec(
            _spec(tmp_path), target, TuneCache(tmp_path / "cache"), tmp_path / "w", env={}, objective="energy"
        )
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())  # nothing was probed
