"""Settings layering and run-spec validation: every user mistake is one located line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.config.settings import load_settings
from gpuwarden.core.config.spec import load_spec, parse_spec
from gpuwarden.core.errors import ConfigError, UserError


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_without_a_file(tmp_path: Path) -> None:
    s = load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path)})
    assert s.sample_interval == 1.0
    assert s.process_interval == 5.0
    assert s.retention.raw_hours == 48
    assert s.retention.minute_days == 30
    assert s.retention.hour_days == 365


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    cfg = write(
        tmp_path, "config.yaml", "sample_interval: 2\nretention:\n  raw_hours: 24\n  hour_days: 100\n"
    )
    env = {"GPUWARDEN_SAMPLE_INTERVAL": "3", "GPUWARDEN_RETENTION__RAW_HOURS": "12"}
    s = load_settings(cfg, environ=env, flags={"sample_interval": 0.5})
    assert s.sample_interval == 0.5  # flag beats env beats file
    assert s.retention.raw_hours == 12  # env beats file
    assert s.retention.hour_days == 100  # file beats default
    s2 = load_settings(cfg, environ=env)
    assert s2.sample_interval == 3


def test_unknown_key_suggests(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.yaml", "sample_interval: 1\nretention:\n  raw_hour: 24\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg, environ={})
    assert str(e.value) == f"{cfg}:3: retention.raw_hour: unknown key — did you mean 'raw_hours'?"


def test_bad_value_names_file_line_and_allowed(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.yaml", "\n\nsample_interval: -1\nlog_level: loud\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg, environ={})
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"{cfg}:3: sample_interval: must be greater than or equal to 0.05")
    assert lines[1].startswith(f"{cfg}:4: log_level: must be 'debug', 'info', 'warning' or 'error'")


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.yaml", "sample_interval: 1\nretention: {raw_hours: 3\n")
    with pytest.raises(UserError) as e:
        load_settings(cfg, environ={})
    msg = str(e.value)
    assert msg.startswith(f"{cfg}:3:1: YAML syntax error:"), msg
    assert "\n" not in msg


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.yaml", "sample_interval: 1\nsample_interval: 2\n")
    with pytest.raises(ConfigError, match=r":2: sample_interval: a duplicate key \(first at line 1\)"):
        load_settings(cfg, environ={})


def test_env_errors_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^environment variable GPUWARDEN_SAMPLE_INTERVAL: sample_interval"
    ):
        load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path), "GPUWARDEN_SAMPLE_INTERVAL": "fast"})
    with pytest.raises(UserError, match="did you mean GPUWARDEN_SAMPLE_INTERVAL"):
        load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path), "GPUWARDEN_SAMPLE_INTERVALL": "1"})


def test_what_the_daemon_gives_a_runs_processes_is_no_setting(tmp_path: Path) -> None:
    # `gpuwarden` typed inside a supervised run inherits these from it.
    inside_a_run = {
        "GPUWARDEN_RUN_TAG": "r1/1",
        "GPUWARDEN_EVENTS_FILE": "/runs/r1/attempts/1/events.jsonl",
        "GPUWARDEN_RUN_ID": "r1",
        "GPUWARDEN_ATTEMPT": "1",
        "GPUWARDEN_RESUME_FROM": "",
    }
    settings = load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path), **inside_a_run})
    assert settings == load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path)})


def test_flag_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--sample-interval: sample_interval"):
        load_settings(None, environ={"XDG_CONFIG_HOME": str(tmp_path)}, flags={"sample_interval": 0.0})


@pytest.mark.parametrize(
    "text",
    ["- a\n- b\n", "just a string\n", "42\n"],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    cfg = write(tmp_path, "config.yaml", text)
    with pytest.raises(UserError, match="expected a mapping"):
        load_settings(cfg, environ={})


def test_missing_and_directory_config(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        load_settings(tmp_path / "nope.yaml", environ={})
    with pytest.raises(UserError, match="is a directory"):
        load_settings(tmp_path, environ={})


def test_command_spec_ok(tmp_path: Path) -> None:
    spec = load_spec(
        write(
            tmp_path,
            "s.yaml",
            "name: hello\nkind: command\ncommand:\n  argv: [echo, hi]\nresources:\n  gpus: 0\n",
        )
    )
    assert spec.command is not None and spec.command.argv == ["echo", "hi"]
    assert spec.resources.gpus == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: a\nkind: train\ntrain:\n  task: image\n  batch_size: -4\n",
            "s.yaml:5: train.batch_size: must be greater than 0 (got -4)",
        ),
        (
            "name: a\nkind: train\ntrain:\n  task: image\n  batchsize: 4\n",
            "s.yaml:5: train.batchsize: unknown key — did you mean 'batch_size'?",
        ),
        (
            "name: a\nkind: train\ntrain:\n  task: image\n  precision: fp8\n",
            "s.yaml:5: train.precision: must be 'auto', 'bf16', 'fp16' or 'fp32' (got 'fp8')",
        ),
        ("name: a\nkind: command\n", "kind 'command' needs a `command:` section with `argv:`"),
        ("name: a\nkind: shell\n", "s.yaml:2: kind: must be 'command', 'train' or 'infer' (got 'shell')"),
        ("name: 'bad name'\nkind: command\ncommand: {argv: [x]}\n", "s.yaml:1: name: must be 1–64 letters"),
        (
            "name: r0123456789\nkind: command\ncommand: {argv: [x]}\n",
            "s.yaml:1: name: 'r0123456789' has the form of a run id (r + 10 hex digits) — choose another name",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: []}\n",
            "s.yaml:3: command.argv: List should have at least 1 item",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: -1}\n",
            "resources.gpus: must be ≥ 0",
        ),
        ("name: a\nkind: train\ntrain:\n  task: causal_lm\n", "needs `model:`"),
        (
            "name: a\nkind: train\ntrain: {task: image, amp: true, precision: fp32}\n",
            "amp: true contradicts precision: fp32",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\ntrain: {task: image}\n",
            "kind 'command' does not use `train:`",
        ),
        # union-typed keys: no pydantic member tags, one line saying what is accepted
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\npolicy: defualt\n",
            "s.yaml:4: policy: unknown retune policy 'defualt' — did you mean 'default'?",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\npolicy: {base: default, max_attempts: -1}\n",
            "s.yaml:4: policy.max_attempts: must be greater than or equal to 0 (got -1)",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\npolicy: {base: default, max_attempt: 3}\n",
            "s.yaml:4: policy.max_attempt: unknown key — did you mean 'max_attempts'?",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: [1, {a: 1}]}\n",
            "s.yaml:4: resources.gpus[1]: must be a valid string (got a mapping of 1 key)",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: 1.5}\n",
            "s.yaml:4: resources.gpus: must be one of: an integer, a list (got 1.5)",
        ),
        # sizes a typo made huge, or that no process can start under: refused at submission
        (
            "name: a\nkind: train\ntrain: {task: image, batch_size: 99999999999999999999999}\n",
            "s.yaml:3: train.batch_size: must be less than or equal to 1048576 (got 99999999… (23 characters))",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {memory_limit: '0'}\n",
            "s.yaml:4: resources.memory_limit: 0 B leaves no room to start a process — give at least 64 MiB",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {memory_limit: 99999999PiB}\n",
            "resources.memory_limit: 102399998976 TiB is more than any machine has — leave it out",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {memory_limit: -3GiB}\n",
            "resources.memory_limit: must be a positive size such as 6GiB (got '-3GiB')",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: [abc]}\n",
            "resources.gpus: 'abc' names no GPU — give indices (0, 1) or UUIDs (GPU-…)",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: [0, 0]}\n",
            "resources.gpus: '0' is listed twice — name each GPU once",
        ),
        (
            "name: a\nkind: command\ncommand: {argv: [x]}\nknobs: {a: [1]}\n",
            "s.yaml:4: knobs.a: must be one of: an integer, a number, a string, true/false (got a list of 1 item)",
        ),
    ],
)
def test_spec_errors_are_one_located_line(text: str, expected: str) -> None:
    with pytest.raises(UserError) as e:
        parse_spec(text, "s.yaml")
    msg = str(e.value)
    assert expected in msg, msg
    assert len(msg.splitlines()) == 1, msg


def test_gpu_indices_may_be_numbers() -> None:
    spec = parse_spec("name: a\nkind: command\ncommand: {argv: [x]}\nresources: {gpus: [0, GPU-x]}\n")
    assert spec.resources.gpus == ["0", "GPU-x"]


def test_amp_true_means_mixed_precision() -> None:
    spec = parse_spec("name: a\nkind: train\ntrain: {task: image, amp: true}\n")
    assert spec.train is not None
    assert spec.train.resolved_precision_request() == "auto"
    spec = parse_spec("name: a\nkind: train\ntrain: {task: image, amp: false}\n")
    assert spec.train is not None and spec.train.resolved_precision_request() == "fp32"


def test_effective_batch() -> None:
    spec = parse_spec("name: a\nkind: train\ntrain: {task: image, batch_size: 4, grad_accum_steps: 8}\n")
    assert spec.train is not None and spec.train.effective_batch == 32


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+400"])
def test_a_knob_that_is_no_finite_number_is_refused_naming_it(value: str) -> None:
    text = f"name: a\nkind: command\ncommand: {{argv: [echo, '{{bs}}']}}\nknobs: {{bs: {value}}}\n"
    with pytest.raises(
        ConfigError, match=r"knobs: bs: -?(nan|inf) is not a finite number — give one, or quote it"
    ):
        parse_spec(text)
