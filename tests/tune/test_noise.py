"""A pick that noise could have made is said, re-measured a bounded number of times, and not
remembered; a clear winner is remembered as before. Readings come from a fake probe whose noise
each test sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.core.tune import noise
from gpuwarden.core.tune.cache import TuneCache
from gpuwarden.core.tune.search import MAX_RIVALS, Candidate, ProbeResult, Search

GB = 10**9


class Readings:
    """samples/s given per micro-batch, read in order (the last one repeats): the noise of each
    reading is the test's to choose."""

    def __init__(self, readings: dict[int, list[float]]) -> None:
        self.readings = {b: list(v) for b, v in readings.items()}
        self.calls: list[int] = []

    def __call__(self, c: Candidate) -> ProbeResult:
        self.calls.append(c.batch_size)
        queue = self.readings[c.batch_size]
        rate = queue.pop(0) if len(queue) > 1 else queue[0]
        return ProbeResult(c, ok=True, samples_per_s=rate, mem_peak=GB, wall_s=10.0)


def _search(probe: Readings, settle_rounds: int = 2) -> Search:
    return Search(probe, capacity=80 * GB, settle_rounds=settle_rounds)


def test_the_band_narrows_with_readings_and_a_rival_must_reach_past_min_gain() -> None:
    once, four = noise.Standing("a", (100.0,)), noise.Standing("b", (100.0, 100.0, 100.0, 100.0))
    assert once.band(0.2) == pytest.approx((90.0, 110.0))
    assert four.band(0.2) == pytest.approx((95.0, 105.0))
    pick = noise.Standing("p", (100.0, 100.0, 100.0, 100.0))
    # A plateau: 2 % apart with 2 % noise is a tie, not a rival.
    assert not noise.could_beat(noise.Standing("o", (102.0, 102.0)), pick, 0.02, 0.05)
    # 38.8 % apart with 38.8 % noise could be better by far more than 5 %.
    assert noise.could_beat(noise.Standing("o", (90.0,)), pick, 0.388, 0.05)


def test_a_pick_read_once_is_checked_when_the_noise_is_unknown_or_above_min_gain() -> None:
    pick, other = noise.Standing("p", (16.25,)), noise.Standing("o", (4.89,))
    assert noise.rivals(pick, [other], None, 0.05, read_once=True) == [other]
    assert noise.rivals(pick, [other], 0.388, 0.05, read_once=True) == [other]
    assert noise.rivals(pick, [other], 0.01, 0.05, read_once=True) == []  # a steady machine
    assert noise.rivals(noise.Standing("p", (16.25, 16.0)), [other], 0.388, 0.05) == []


def test_the_setting_tuned_from_stays_a_rival_until_the_pick_beats_it_beyond_the_noise() -> None:
    pick = noise.Standing("p", (10.4, 10.4))
    start = noise.Standing("s", (10.0, 10.0))
    assert noise.rivals(pick, [start], 0.1, 0.05) == []  # within min_gain: a tie to the search
    assert noise.rivals(pick, [start], 0.1, 0.05, start="s") == [start]
    assert noise.rivals(pick, [start], 0.01, 0.05, start="s") == []  # 4 % apart, 1 % noise


def test_a_noisy_pair_is_said_and_uncertain_and_the_setting_tuned_from_is_kept() -> None:
    # The user's trial: 4 read 16.25 once at a quiet moment; side by side, 4 and 1 read alike.
    probe = Readings({1: [5.0, 5.1, 5.2], 4: [16.25, 5.2, 5.0], 2: [4.89, 5.1, 5.2]})
    result = _search(probe).run(Candidate(1, 4, "fp32", False), per_device_batch=4)
    assert probe.calls[:3] == [1, 4, 2]  # the search itself: 4 won on its one reading
    settling = result.settling
    assert settling.groups == [["4 × 1", "1 × 4"], ["4 × 1", "1 × 4", "2 × 2"]]
    assert result.uncertain
    assert settling.within_noise == ["1 × 4", "4 × 1"]
    assert result.best is not None and result.best.candidate.batch_size == 1
    assert settling.says == (
        "micro-batch 1 × 4 and 4 × 1 are within the noise (repeated readings typically 4.2 % apart) after 2 "
        "interleaved re-measure rounds: kept 1 × 4, the setting tuned from; not remembered — the next "
        "tune measures again"
    )
    assert result.to_dict()["uncertain"] is True
    assert result.to_dict()["settling"]["within_noise"] == ["1 × 4", "4 × 1"]


def test_re_measures_are_interleaved_and_bounded() -> None:
    # Readings that never settle: each candidate alternates between two far-apart values.
    flip = [10.0, 6.0] * 20
    probe = Readings({b: list(flip) for b in (1, 2, 3, 4, 6, 12)})
    result = _search(probe, settle_rounds=3).run(Candidate(1, 12, "fp32", False), per_device_batch=12)
    settling = result.settling
    assert settling.rounds == 3 and len(settling.groups) == 3
    assert settling.probes == sum(len(g) for g in settling.groups) <= 3 * (1 + MAX_RIVALS)
    # Each round reads the pick and each rival once, one after the other: drift weighs on all.
    assert all(2 <= len(g) == len(set(g)) <= 1 + MAX_RIVALS for g in settling.groups)
    assert len(result.trials) == len(probe.calls)
    assert result.uncertain


def test_a_clear_winner_is_checked_once_and_not_uncertain() -> None:
    probe = Readings({1: [5.0, 5.05], 4: [10.0, 10.1, 10.0], 2: [7.0, 7.1]})
    result = _search(probe).run(Candidate(1, 4, "fp32", False), per_device_batch=4)
    assert not result.uncertain
    assert result.best is not None and result.best.candidate.batch_size == 4
    assert result.settling.rounds == 1 and probe.calls[3:] == [4, 2]
    assert result.settling.says == (
        "re-measured 4 × 1 and 2 × 2 once, interleaved: 4 × 1 kept, no other within the noise of beating it by 5 %"
    )


def test_a_winner_measured_quietly_needs_no_re_measure() -> None:
    # The search repeated 4 (2.5 % apart, under min_gain): 12 read 810, well inside a tie.
    probe = Readings({4: [800, 780], 12: [810], 8: [790], 6: [790]})
    result = _search(probe).run(Candidate(4, 60, "fp32", False), per_device_batch=240)
    assert not result.uncertain and result.settling.rounds == 0 and result.settling.says is None


def test_a_rival_that_wins_side_by_side_takes_the_lead() -> None:
    # 1 read high once, on a machine whose repeated readings differ by more than min_gain;
    # measured beside it, 4 is clearly faster.
    probe = Readings({1: [12.0, 8.0, 8.0], 4: [10.0, 11.0, 10.1], 2: [9.0, 9.1]})
    result = _search(probe).run(Candidate(1, 4, "fp32", False), per_device_batch=4)
    assert result.best is not None and result.best.candidate.batch_size == 4


def test_an_uncertain_result_is_stored_but_not_reused(tmp_path: Path) -> None:
    cache = TuneCache(tmp_path / "tune")
    cache.put("fp-noisy", {}, {"best": None}, {"batch_size": 1}, uncertain=True)
    assert cache.get("fp-noisy") is None  # the next tune measures again
    stored = json.loads((tmp_path / "tune" / "fp-noisy.json").read_text())
    assert stored["uncertain"] is True and stored["knobs"] == {"batch_size": 1}
    cache.put("fp-clear", {}, {"best": None}, {"batch_size": 4})
    entry = cache.get("fp-clear")
    assert entry is not None and entry["knobs"] == {"batch_size": 4}
