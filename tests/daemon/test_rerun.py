"""`gpuwarden rerun RUN --knob NAME=VALUE`: a new run from a finished run's spec, changed."""

from __future__ import annotations

import json

from gpuwarden.tui.rerun_spec import rerun_spec
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
