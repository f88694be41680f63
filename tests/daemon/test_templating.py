"""`{knob}` placeholders in command argv/env."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.config.templating import check_command, render, render_argv, render_command
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
            "command.argv[1]: unknown placeholder {lrr} — knobs and built-ins are: attempt, config_file, events_file, lr",
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


@pytest.mark.parametrize(
    ("argv", "empty", "filled"),
    [
        # a flag right before an item that is the optional placeholder alone goes with it
        (
            ["t", "--resume", "{resume_from?}", "--bs", "4"],
            ["t", "--bs", "4"],
            ["t", "--resume", "/c", "--bs", "4"],
        ),
        # one item holding flag and value
        (["t", "--resume={resume_from?}"], ["t"], ["t", "--resume=/c"]),
        # a positional placeholder alone: only the item goes
        (["t", "x", "{resume_from?}"], ["t", "x"], ["t", "x", "/c"]),
        # the item before is not a flag (a value of another flag): it stays
        (["t", "--n", "3", "{resume_from?}"], ["t", "--n", "3"], ["t", "--n", "3", "/c"]),
        # a non-optional placeholder stays as an empty item
        (["t", "--resume", "{resume_from}"], ["t", "--resume", ""], ["t", "--resume", "/c"]),
        # a switch that takes no value: the text stands for the path, the flag before it stays
        (["t", "--fast", "{resume_from?--resume}"], ["t", "--fast"], ["t", "--fast", "--resume"]),
        # the text may hold what the parser reads as a spec or a conversion
        (["t", "{resume_from?--from=auto:last!}"], ["t"], ["t", "--from=auto:last!"]),
    ],
)
def test_optional_placeholders_drop_their_item_and_its_flag_when_empty(
    argv: list[str], empty: list[str], filled: list[str]
) -> None:
    assert render_argv(argv, {"resume_from": ""}) == empty
    assert render_argv(argv, {"resume_from": "/c"}) == filled


def test_an_empty_optional_placeholder_still_checks_its_item() -> None:
    with pytest.raises(UserError, match=r"unknown placeholder \{nope\}"):
        render_argv(["t", "--r={resume_from?}{nope}"], {"resume_from": ""})


def test_a_comparison_placeholder_is_a_switch() -> None:
    spec = _spec(
        ["train", "--bf16", "{precision=bf16}", "--fp16={precision=fp16}", "--ckpt={gc=true}"],
        env={"AMP": "{precision=bf16}"},
        knobs={"precision": "bf16", "gc": True},
    )
    argv, env = render_command(spec, {"run_id": "r", "run_dir": "/r", "attempt": 1, "events_file": "/e"})
    assert argv == ["train", "--bf16", "true", "--fp16=false", "--ckpt=true"]
    assert env == {"AMP": "true"}
    with pytest.raises(UserError, match=r"unknown placeholder \{precison=bf16\}"):
        check_command(_spec(["x", "{precison=bf16}"], knobs={"precision": "bf16"}))


def test_conversions_and_booleans_read_as_yaml_writes_them() -> None:
    values = {"s": "a b", "flag": True, "n": 3}
    assert render("{s!r} {s!a} {s!s} {n!s:>3}", values, "w") == "'a b' 'a b' a b   3"
    assert render("{flag} {flag!s} {flag:>5} {flag!r}", values, "w") == "true true  true True"
    assert render("{n:03d}", values, "w") == "003"
