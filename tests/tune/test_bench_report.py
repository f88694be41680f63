"""The report of `bench tune` from given readings: medians over sweep rounds measured in the same
run, and no verdict where the readings spread more than the comparison can resolve."""

from __future__ import annotations

from typing import Any

import pytest

from bench.figures import table
from bench.tune_report import SearchRun, medians, rows

WHAT: dict[str, Any] = {
    "space": "3 configurations",
    "measured": "effective batch 240; alternated in this run",
}


def _rounds(*readings: dict[str, float | None]) -> list[dict[str, float | None]]:
    return list(readings)


def test_steady_readings_give_a_verdict_on_the_medians() -> None:
    rounds = _rounds(
        {"4": 100.0, "40": 196.0, "60": 200.0},
        {"4": 101.0, "40": 194.0, "60": 199.0},
        {"4": 99.0, "40": 195.0, "60": 201.0},
    )
    searches = [SearchRun("40", 10.0, 6), SearchRun("60", 11.0, 7), SearchRun("40", 12.0, 6, uncertain=True)]
    share, time, spread = rows(rounds, [60.0, 61.0, 59.0], searches, **WHAT)
    assert share["values"] == pytest.approx([97.5, 100.0, 97.5])  # 195 / 200, medians of the rounds
    assert share["target"] == "≥ 95" and share["ok"] is True
    assert "picks 40, 60, 40 vs 60; 1 of 3 within the noise, not remembered" in share["benchmark"]
    assert time["values"] == pytest.approx([100 * 10 / 60, 100 * 11 / 60, 100 * 12 / 60])
    assert time["target"] == "≤ 33.3" and time["ok"] is True
    assert spread["benchmark"].startswith("sweep: spread of one configuration's readings")


def test_readings_that_spread_more_than_the_comparison_needs_give_no_verdict() -> None:
    # A loaded machine: the best configuration read 38 % apart over the rounds.
    rounds = _rounds(
        {"4": 100.0, "40": 190.0, "60": 200.0},
        {"4": 100.0, "40": 190.0, "60": 124.0},
        {"4": 100.0, "40": 190.0, "60": 200.0},
    )
    share, time, _ = rows(rounds, [60.0, 60.0, 60.0], [SearchRun("40", 10.0, 6)] * 3, **WHAT)
    assert share["value"] == pytest.approx(95.0)  # on the target, but the readings cannot tell
    assert share["ok"] is None
    assert share["target"] == "≥ 95 — spread 38 % > the 5 % the comparison needs: not meaningful at this load"
    assert time["ok"] is True  # the rounds took the same time: that comparison still holds
    assert "not meaningful at this load" in table([share])


def test_a_time_figure_nearer_its_target_than_the_rounds_agree_gives_no_verdict() -> None:
    rounds = _rounds({"4": 100.0, "40": 200.0}, {"4": 100.0, "40": 200.0}, {"4": 100.0, "40": 200.0})
    searches = [SearchRun("40", 19.0, 6)] * 3
    # 19 s of a 60 s round is 31.7 %: 5 % from the target, while the rounds took 50–70 s.
    _, time = rows(rounds, [50.0, 60.0, 70.0], searches, **WHAT)
    assert time["ok"] is None
    assert time["target"].startswith("≤ 33.3 — spread 33 % > the 5 % the comparison needs")


def test_a_configuration_that_failed_in_a_round_is_left_out_and_cannot_be_scored() -> None:
    rounds = _rounds({"4": 100.0, "240": 300.0}, {"4": 100.0, "240": None}, {"4": 100.0, "240": 310.0})
    assert medians(rounds) == {"4": 100.0}
    with pytest.raises(RuntimeError, match="a search picked 240, which the sweep has no reading of"):
        rows(rounds, [1.0, 1.0, 1.0], [SearchRun("240", 1.0, 1)] * 3, **WHAT)
