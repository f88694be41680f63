"""Retune policies: shipped YAML, named and inline loading, one-line errors with file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.core.oom.policy import (
    ACTIONS,
    DEFAULT_WHEN,
    PACKAGE_POLICY_DIR,
    PolicyOverride,
    PolicyRef,
    RetunePolicy,
    Rung,
    available_policies,
    load_policy,
    load_policy_file,
    resolve_policy,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("default", "inference", "conservative")


def test_the_package_ships_each_policy_once() -> None:
    package = sorted(p.name for p in PACKAGE_POLICY_DIR.glob("*.yaml"))
    assert package == sorted(f"{n}.yaml" for n in SHIPPED)
    assert not (REPO / "configs" / "policies").exists()  # one copy: the package's


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_policy_loads(name: str) -> None:
    policy = load_policy(name, search_dirs=[PACKAGE_POLICY_DIR])
    assert policy.name == name
    assert policy.ladder
    assert policy.allow == []  # changes to results are the user's opt-in
    for rung in policy.ladder:
        assert rung.when, rung.action


def test_default_ladder_order() -> None:
    policy = load_policy("default", search_dirs=[PACKAGE_POLICY_DIR])
    assert [r.action for r in policy.ladder] == [
        "allocator_expandable_segments",
        "wait_for_memory",
        "move_gpu",
        "reduce_world_size",
        "reduce_eval_batch",
        "reduce_micro_batch",
        "reduce_generation_batch",
        "gradient_checkpointing",
        "lower_precision",
        "reduce_max_length",
        "reduce_max_pixels",
        "reduce_max_new_tokens",
        "offload",
        "load_in_8bit",
    ]
    assert policy.headroom == 0.08
    assert policy.ladder[0].when == ["gpu_fragmentation"]


def test_every_action_has_default_verdicts() -> None:
    assert set(DEFAULT_WHEN) == set(ACTIONS)
    for action in ACTIONS:
        assert RetunePolicy.model_validate({"ladder": [{"action": action}]}).ladder[0].when


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_unknown_action_is_one_line_with_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "ladder:\n  - action: reduce_micro_batch\n  - action: reduce_microbatch\n")
    with pytest.raises(ConfigError) as info:
        load_policy_file(path)
    assert info.value.problems == [
        f"{path}:3: ladder[1].action: unknown action 'reduce_microbatch' — did you mean 'reduce_micro_batch'?"
    ]


def test_unknown_key_is_located(tmp_path: Path) -> None:
    path = write(tmp_path, "ladder:\n  - action: offload\nmax_attempt: 3\n")
    with pytest.raises(ConfigError) as info:
        load_policy_file(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}:3: max_attempt: unknown key — did you mean 'max_attempts'?")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "ladder:\n  - action: reduce_micro_batch\n    when: [gpu_contention]\n",
            "shrinking the run is not the fix",
        ),
        ("ladder:\n  - action: wait_for_memory\n    when: [gpu_capacity]\n", "only answers gpu_contention"),
        ("ladder:\n  - action: reduce_micro_batch\n    when: [shape_bug]\n", "never retuned"),
        (
            "ladder:\n  - action: reduce_micro_batch\n    when: [gpu_capasity]\n",
            "did you mean 'gpu_capacity'?",
        ),
        ("ladder:\n  - action: gradient_checkpointing\n    factor: 0.5\n", "`factor` does not apply"),
        ("ladder:\n  - action: reduce_max_length\n    factor: 1.5\n", "ladder[0].factor"),
        ("ladder: []\n", "ladder"),
        ("ladder:\n  - action: offload\nallow: [max_lenght]\n", "did you mean 'max_length'?"),
        ("ladder:\n  - action: offload\nheadroom: 0.9\n", "headroom"),
        ("ladder:\n  - action: offload\n    cpu_memory: lots\n", "write it like 30GiB"),
    ],
)
def test_invalid_policies(tmp_path: Path, yaml_text: str, expected: str) -> None:
    path = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as info:
        load_policy_file(path)
    assert len(info.value.problems) == 1
    assert expected in info.value.problems[0]
    assert info.value.problems[0].startswith(f"{path}:")


def test_unknown_policy_name_suggests() -> None:
    with pytest.raises(UserError, match="did you mean 'default'"):
        load_policy("defualt", search_dirs=[PACKAGE_POLICY_DIR])
    with pytest.raises(UserError, match="not a policy name"):
        load_policy("my policy", search_dirs=[PACKAGE_POLICY_DIR])


def test_user_dir_shadows_package(tmp_path: Path) -> None:
    write(tmp_path, "ladder:\n  - action: gradient_checkpointing\nmax_attempts: 1\n", "default.yaml")
    write(tmp_path, "ladder:\n  - action: offload\n", "mine.yaml")
    dirs = [tmp_path, PACKAGE_POLICY_DIR]
    assert load_policy("default", search_dirs=dirs).max_attempts == 1
    assert load_policy("conservative", search_dirs=dirs).max_attempts == 4
    assert available_policies(dirs) == ["conservative", "default", "inference", "mine"]


def test_load_by_path(tmp_path: Path) -> None:
    path = write(tmp_path, "ladder:\n  - action: offload\n")
    assert load_policy(str(path)).name == "mine"


def test_resolve_default_by_kind() -> None:
    dirs = [PACKAGE_POLICY_DIR]
    assert resolve_policy(None, kind="train", search_dirs=dirs).name == "default"
    assert resolve_policy(None, kind="infer", search_dirs=dirs).name == "inference"
    assert resolve_policy("conservative", search_dirs=dirs).name == "conservative"


def test_inline_overrides_merge_onto_base() -> None:
    ref = PolicyOverride.model_validate({"base": "default", "max_attempts": 5, "allow": ["effective_batch"]})
    policy = resolve_policy(ref, search_dirs=[PACKAGE_POLICY_DIR])
    base = load_policy("default", search_dirs=[PACKAGE_POLICY_DIR])
    assert policy.max_attempts == 5
    assert policy.allow == ["effective_batch"]
    assert policy.ladder == base.ladder
    assert policy.headroom == base.headroom
    assert policy.name == "default+overrides"


def test_inline_ladder_replaces_base_ladder() -> None:
    ref = PolicyOverride.model_validate({"ladder": [{"action": "gradient_checkpointing"}]})
    policy = resolve_policy(ref, search_dirs=[PACKAGE_POLICY_DIR])
    assert [r.action for r in policy.ladder] == ["gradient_checkpointing"]
    assert policy.max_attempts == 8  # from base "default"


class HostSpec(BaseModel):
    """How the lead's RunSpec will hold the field."""

    policy: PolicyRef | None = None


def test_policy_ref_field_accepts_name_or_overrides() -> None:
    assert HostSpec.model_validate({"policy": "inference"}).policy == "inference"
    inline = HostSpec.model_validate({"policy": {"base": "conservative", "headroom": 0.2}}).policy
    assert isinstance(inline, PolicyOverride)
    assert resolve_policy(inline, search_dirs=[PACKAGE_POLICY_DIR]).headroom == 0.2


def test_inline_unknown_action_is_rejected() -> None:
    with pytest.raises(ValueError, match="did you mean 'load_in_8bit'"):
        PolicyOverride.model_validate({"ladder": [{"action": "load_in_8bits"}]})


def test_hang_watch_defaults_and_inline_keys_over_the_base() -> None:
    base = load_policy("default", search_dirs=[PACKAGE_POLICY_DIR])
    assert (base.hang.factor, base.hang.min_seconds, base.hang.warmup_steps) == (20, 120, 2)
    ref = PolicyOverride.model_validate({"hang": {"min_seconds": 30}})
    policy = resolve_policy(ref, search_dirs=[PACKAGE_POLICY_DIR])
    assert (policy.hang.factor, policy.hang.min_seconds) == (20, 30)  # the rest stays the base's


def test_a_stored_override_keeps_the_base_where_it_says_nothing() -> None:
    """A run's stored spec carries every key of an inline policy, the unset ones as null."""
    stored = PolicyOverride.model_validate({"max_attempts": 3}).model_dump(mode="json")
    assert stored["ladder"] is None and stored["hang"] is None
    policy = resolve_policy(PolicyOverride.model_validate(stored), search_dirs=[PACKAGE_POLICY_DIR])
    base = load_policy("default", search_dirs=[PACKAGE_POLICY_DIR])
    assert policy.ladder == base.ladder and policy.max_attempts == 3 and policy.hang == base.hang


@pytest.mark.parametrize(
    ("hang", "message"),
    [({"factor": 1}, "greater than or equal to 2"), ({"min_seconds": 0}, "greater than or equal to 1"),
     ({"every": 3}, "every")],
)  # fmt: skip
def test_hang_watch_bounds_are_checked(hang: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        PolicyOverride.model_validate({"hang": hang})
    assert message in str(err.value)


def test_reduce_world_size_answers_contention_only() -> None:
    assert Rung.model_validate({"action": "reduce_world_size"}).when == ["gpu_contention"]
    with pytest.raises(ValidationError, match="only answers gpu_contention"):
        Rung.model_validate({"action": "reduce_world_size", "when": ["gpu_capacity"]})
