"""`restart:` in a run spec: the forms a user writes, and one located line for each mistake."""

from __future__ import annotations

import pytest

from gpuwarden.core.config.spec import parse_spec, spec_from_mapping
from gpuwarden.core.errors import UserError

BASE = "name: r\nkind: command\ncommand: {argv: [python, train.py]}\n"


def test_off_by_default_and_the_documented_form_parses() -> None:
    assert parse_spec(BASE).restart is None
    spec = parse_spec(BASE + "restart:\n  on: [signal, exit_code: [1, 75]]\n  max: 2\n  backoff: 5\n")
    policy = spec.restart
    assert policy is not None and policy.on_signal and policy.exit_codes == {1, 75}
    assert (policy.max, policy.backoff) == (2, 5.0)


def test_defaults_and_a_single_code_without_a_list() -> None:
    policy = parse_spec(BASE + "restart: {on: [exit_code: 137]}\n").restart
    assert policy is not None and not policy.on_signal and policy.exit_codes == {137}
    assert (policy.max, policy.backoff) == (3, 10.0)


def test_the_stored_document_validates_again_unchanged() -> None:
    spec = parse_spec(BASE + "restart: {on: [signal, exit_code: [1]], max: 4}\n")
    document = spec.model_dump(mode="json")
    assert document["restart"] == {"on": ["signal", {"exit_code": [1]}], "max": 4, "backoff": 10.0}
    assert spec_from_mapping(document).restart == spec.restart


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "restart: {on: [signals]}",
            "restart.on: 'signals' is not a restart trigger — use `signal`, `hang` or",
        ),
        ("restart: {on: []}", "restart.on: no trigger given — use `signal`, `hang` or `exit_code: [1, 2]`"),
        ("restart: {max: 2}", "restart.on: required key is missing"),
        ("restart: {on: [exit_code: [0]]}", "exit_code 0 is no failure exit code — give codes from 1 to 255"),
        ("restart: {on: [exit_code: [256]]}", "exit_code 256 is no failure exit code"),
        ("restart: {on: [exit_code: ['x']]}", "exit_code 'x' is no failure exit code"),
        (
            "restart: {on: [exit_code: [75, 143]]}",
            "exit_code 143 means stopped by SIGTERM, which never restarts",
        ),
        ("restart: {on: [{exit_code: [1], when: 2}]}", "is not a restart trigger"),
        ("restart: {on: [signal], max: 0}", "restart.max: must be greater than or equal to 1"),
        ("restart: {on: [signal], backoff: -1}", "restart.backoff: must be greater than or equal to 0"),
        ("restart: {on: [signal], maxx: 1}", "restart.maxx: unknown key — did you mean 'max'?"),
    ],
)
def test_each_mistake_is_one_located_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_spec(BASE + text + "\n", "run.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.yaml:4: "), lines
    assert message in lines[0]
