"""`{knob}` placeholders in command argv/env."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.config.templating import check_command, render, render_command
from gpuwarden.core.errors import UserError


def _spec(argv: list[str], env: dict[str, str] | None = None, knobs: dict[str, Any] | None = None) -> Any:
    return spec_from_mapping(
        {"name": "t", "kind": "command", "command": {"argv": argv, "env": env or {}}, "knobs": knobs or {}}
    )


def test_knobs_builtins_and_format_specs_are_filled() -> None:
    spec = _spec(
        ["train", "--bs={bs}", "--lr={lr:.1e}", "--amp={amp}", "{run_dir}/out", "{{literal}}"],
        env={"STEPS": "{steps}", "ATTEMPT": "{attempt}"},
        knobs={"bs": 32, "lr": 0.0003, "amp": True, "steps": 100},
    )
    argv, env = render_command(
        spec, {"run_id": "r1", "run_dir": "/runs/r1", "attempt": 2, "events_file": "/e"}
    )
    assert argv == ["train", "--bs=32", "--lr=3.0e-04", "--amp=true", "/runs/r1/out", "{literal}"]
    assert env == {"STEPS": "100", "ATTEMPT": "2"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["x", "{lrr}"],
            "command.argv[1]: unknown placeholder {lrr} — knobs and built-ins are: attempt, events_file, lr",
        ),
        (["x", "{"], "command.argv[1]: Single '{' encountered in format string"),
        (["x", "}"], "command.argv[1]: Single '}' encountered in format string"),
        (["x", "{0}"], "command.argv[1]: placeholder {0} is not a knob name"),
        (["x", "{lr.real}"], "command.argv[1]: placeholder {lr.real} is not a knob name"),
        (["x", "{lr:q}"], "command.argv[1]: {lr:q}: Unknown format code 'q'"),
    ],
)
def test_bad_placeholders_fail_at_submit_with_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        check_command(_spec(argv, knobs={"lr": 0.1}))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_env_placeholders_are_checked_and_knobs_may_not_shadow_builtins() -> None:
    with pytest.raises(UserError, match=r"command.env.X: unknown placeholder \{nope\}"):
        check_command(_spec(["x"], env={"X": "{nope}"}))
    with pytest.raises(UserError, match=r"knobs\.run_dir: the name is reserved"):
        check_command(_spec(["x"], knobs={"run_dir": "/tmp"}))


def test_render_leaves_text_without_placeholders_alone() -> None:
    assert render("plain text: 100%", {}, "w") == "plain text: 100%"
