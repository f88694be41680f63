"""`gpuwarden rerun RUN --knob NAME=VALUE`: a new run from a finished run's spec, changed."""

from __future__ import annotations

import json

from gpuwarden.tui.rerun_spec import effective_batch_note, rerun_spec
from tests.daemon.conftest import DaemonHandle, command_spec


def test_rerun_runs_the_old_spec_again_with_a_knob_changed(gw: DaemonHandle) -> None:
    spec = command_spec("knobbed", "import sys; print('n is', sys.argv[1], 'at', sys.argv[2])")
    spec["command"]["argv"] += ["{n}", "{lr}"]
    first = gw.submit({**spec, "knobs": {"n": 2, "lr": 0.1}, "resources": {"gpus": 0}})
    assert gw.wait_state(first["id"])["state"] == "succeeded"

    done = gw.cli("rerun", "knobbed", "--knob", "n=5", "--json")
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    assert again["id"] != first["id"] and again["name"] == "knobbed"
    assert gw.wait_state(again["id"])["state"] == "succeeded"
    assert gw.cli_json("logs", again["id"])["data"] == "n is 5 at 0.1\n"  # the other knob kept
    assert gw.cli_json("show", first["id"])["spec"]["knobs"] == {"n": 2, "lr": 0.1}  # left as it was

    renamed = gw.cli("rerun", first["id"], "--knob", "lr=0.5", "--name", "knobbed-lr", "-f")
    assert renamed.returncode == 0, renamed.stderr
    assert renamed.stdout == "n is 2 at 0.5\n"

    wrong = gw.cli("rerun", first["id"], "--knob", "m=1")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == (
        "gpuwarden: 'm' is not a knob of this run (its knobs: n, lr) — `gpuwarden show RUN --json` shows its spec\n"
    )
    shapeless = gw.cli("rerun", first["id"], "--knob", "n")
    assert shapeless.returncode == 2
    assert shapeless.stderr == "gpuwarden: --knob 'n': write it as NAME=VALUE, e.g. --knob batch_size=8\n"


def test_a_rerun_that_changes_the_effective_batch_says_so_and_what_keeps_it(gw: DaemonHandle) -> None:
    spec = command_spec("batched", "import sys; print('batch', sys.argv[1], 'x', sys.argv[2])")
    spec["command"]["argv"] += ["{bs}", "{acc}"]
    spec["command"]["roles"] = {"micro_batch": "bs", "accum_steps": "acc"}
    first = gw.submit({**spec, "knobs": {"bs": 32, "acc": 1}, "resources": {"gpus": 0}})
    assert gw.wait_state(first["id"])["state"] == "succeeded"

    halved = gw.cli("rerun", "batched", "--knob", "bs=8")
    assert halved.returncode == 0, halved.stderr
    assert halved.stderr == "note: the effective batch changes, 32 → 8; acc=4 keeps it\n"
    kept = gw.cli("rerun", first["id"], "--knob", "bs=8", "--knob", "acc=4")
    assert kept.returncode == 0 and kept.stderr == "", kept.stderr
    odd = gw.cli("rerun", first["id"], "--knob", "bs=5")
    assert (
        odd.stderr
        == "note: the effective batch changes, 32 → 5 (no whole accumulation keeps it at this micro-batch)\n"
    )


def test_a_train_runs_settings_are_named_as_the_edit_dialog_names_them() -> None:
    spec = {
        "name": "lm",
        "kind": "train",
        "train": {"task": "causal_lm", "batch_size": 16, "grad_accum_steps": 1},
    }
    changed = rerun_spec("train", spec, {"batch_size": 8, "grad_accum_steps": 2, "resources.gpus": 0})
    assert changed["train"] == {"task": "causal_lm", "batch_size": 8, "grad_accum_steps": 2}
    assert changed["resources"] == {"gpus": 0}
    assert spec["train"]["batch_size"] == 16  # type: ignore[index]  # the old run's spec is untouched


def test_a_train_runs_note_names_its_accumulation_setting() -> None:
    old = {"kind": "train", "train": {"batch_size": 32, "grad_accum_steps": 2, "world_size": 1}}
    spec = {"kind": "train", "train": {"batch_size": 16, "grad_accum_steps": 2, "world_size": 1}}
    note = effective_batch_note("train", old, spec)
    assert note == "note: the effective batch changes, 64 → 32; grad_accum_steps=4 keeps it"
    assert effective_batch_note("train", old, old) is None
    before = {"kind": "command", "knobs": {"batch_size": 64}}  # a knob named so needs no role
    assert effective_batch_note("command", before, {"kind": "command", "knobs": {"batch_size": 4}}) == (
        "note: the effective batch changes, 64 → 4 (the run names no accumulation that could keep it)"
    )
