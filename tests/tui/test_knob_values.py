"""Values typed into the edit dialog are read by the bounded YAML reader: types kept, hostile
text refused with a short message (never a hang or a traceback)."""

from __future__ import annotations

import pytest

from gpuwarden.tui.screens.dialogs import parse_knob


def test_values_keep_their_types() -> None:
    assert parse_knob("train.batch_size=4, precision=fp16, compile=true") == {
        "train.batch_size": 4,
        "precision": "fp16",
        "compile": True,
    }


@pytest.mark.parametrize("raw", ["[" * 10_000, "!!python/object/apply:os.system [true]", "*nothing"])
def test_hostile_values_are_refused_in_one_short_line(raw: str) -> None:
    with pytest.raises(ValueError, match="is not a value") as caught:
        parse_knob(f"train.batch_size={raw}")
    message = str(caught.value)
    assert "is not a value" in message and "\n" not in message and len(message) < 200


def test_a_knob_given_twice_is_refused_rather_than_the_last_one_kept() -> None:
    with pytest.raises(ValueError, match=r"^lr is given twice: give each knob once$"):
        parse_knob("lr=abc def, lr=2")
