"""The linear memory model: fits on synthetic points, the OOM bound, and its edge cases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.core.oom.memory_model import (
    HEADROOM_ON_PEAK,
    HEADROOM_ON_SAMPLES,
    Prediction,
    fit_line,
    headroom_on,
    predict_max_batch,
    worst_peaks,
)

GiB = 1 << 30
MiB = 1 << 20


def line(fixed: int, per_sample: int, batches: list[int]) -> list[tuple[int, int]]:
    return [(b, fixed + per_sample * b) for b in batches]


def test_fit_recovers_exact_line() -> None:
    fixed, per_sample = fit_line(line(10 * GiB, 512 * MiB, [1, 2, 4, 8])) or (0.0, 0.0)
    assert fixed == pytest.approx(10 * GiB)
    assert per_sample == pytest.approx(512 * MiB)


def test_fit_needs_two_distinct_batch_sizes() -> None:
    assert fit_line([]) is None
    assert fit_line([(4, GiB), (4, 2 * GiB)]) is None


def test_fit_uses_worst_peak_per_batch() -> None:
    # Two steps at batch 4 (a short and a long sequence): the model must hold for the long one.
    points = [(2, 12 * GiB), (4, 13 * GiB), (4, 14 * GiB)]
    assert worst_peaks(points) == {2: 12 * GiB, 4: 14 * GiB}
    fixed, per_sample = fit_line(points) or (0.0, 0.0)
    assert per_sample == pytest.approx(GiB)
    assert fixed == pytest.approx(10 * GiB)


def test_worst_peaks_drops_nonsense() -> None:
    assert worst_peaks([(0, GiB), (-1, GiB), (2, -5), (3, GiB)]) == {3: GiB}


def test_prediction_from_fit_with_headroom_on_what_grows_with_the_batch() -> None:
    points = line(10 * GiB, GiB, [2, 4])
    p = predict_max_batch(points, 21 * GiB, headroom=0.08)
    # 10 + 1.08 × b ≤ 21 → b ≤ 10.19 → 10 (8 % of the whole 21 GiB would have left 9)
    assert p.batch == 10
    assert p.fixed == pytest.approx(10 * GiB)
    assert p.per_sample == pytest.approx(GiB)
    assert p.padded_peak(10) == pytest.approx(20.8 * GiB)
    assert p.peak_at(10) == pytest.approx(20 * GiB)
    assert p.spare_at(10) == pytest.approx(1 / 21)
    assert "least-squares" in p.basis
    assert predict_max_batch(points, 21 * GiB, headroom=0.0).batch == 11


def test_fragmentation_pads_the_whole_peak() -> None:
    points = line(10 * GiB, GiB, [2, 4])
    p = predict_max_batch(points, 21 * GiB, headroom=0.08, headroom_on=HEADROOM_ON_PEAK)
    # budget 21 × 0.92 = 19.32 GiB → (19.32 − 10) / 1 = 9.32 → 9
    assert p.batch == 9 and p.headroom_on == "peak"
    assert p.padded_peak(9) == pytest.approx(19 * GiB / 0.92)
    assert headroom_on("gpu_fragmentation") == HEADROOM_ON_PEAK
    assert headroom_on("host_oom") == headroom_on("gpu_capacity") == HEADROOM_ON_SAMPLES
    with pytest.raises(ValueError, match="headroom_on must be"):
        predict_max_batch(points, 21 * GiB, headroom_on="everything")


# Measured: the residual CNN of configs/examples/oom-recovery-cpu.yaml (192 px, effective batch
# 32) under a 1.4 GiB address-space limit, each micro-batch b run as b × 32/b for two steps; the
# runner's worst vm_peak. 32 × 1 ran out of memory; 16 × 2 ran both steps with 6 % to spare.
LIMIT_1_4 = int(1.4 * GiB)
MEASURED = {4: 960_258_048, 8: 1_182_031_872, 16: 1_409_343_488}


def test_the_measured_cnn_fits_sixteen_under_its_limit() -> None:
    # The points the retune now probes (one well under the OOM, then the largest the model says
    # fits): 16 is predicted, and it is the largest divisor of 32 that ran.
    p = predict_max_batch([(4, MEASURED[4]), (16, MEASURED[16])], LIMIT_1_4, 0.08, oom_at=[32])
    assert p.batch is not None and p.batch >= 16
    assert p.spare_at(16) == pytest.approx(0.0625, abs=0.001)
    # 8 % of the whole limit, from the same points, left 15: 8 × 4 where 16 × 2 runs.
    old = predict_max_batch([(4, MEASURED[4]), (16, MEASURED[16])], LIMIT_1_4, 0.08, [32], HEADROOM_ON_PEAK)
    assert old.batch == 15
    # The line through 4 and 8 alone (the old probes at 1/8 and 1/4 of 32) bends the wrong way:
    # address space grows less than linearly here, so it extrapolates too steep to reach 16.
    assert (predict_max_batch([(4, MEASURED[4]), (8, MEASURED[8])], LIMIT_1_4, 0.08, [32]).batch or 0) < 16


def test_prediction_nothing_fits() -> None:
    p = predict_max_batch(line(30 * GiB, GiB, [1, 2]), 24 * GiB)
    assert p.batch == 0


def test_oom_steepens_an_underestimating_fit() -> None:
    # The fit says batch 12 needs 22 GiB < 24 GiB, yet batch 12 ran out of memory.
    points = line(10 * GiB, GiB, [2, 4])
    p = predict_max_batch(points, 24 * GiB, headroom=0.08, oom_at=[12])
    assert p.per_sample is not None and p.per_sample >= (24 * GiB - 10 * GiB) / 12
    assert p.batch is not None and p.batch < 12
    assert "steepened" in p.basis


def test_oom_caps_prediction_below_oom_batch() -> None:
    points = line(GiB, 10 * MiB, [2, 4])  # the line says hundreds fit
    p = predict_max_batch(points, 24 * GiB, oom_at=[64])
    assert p.batch is not None and p.batch <= 63


def test_one_point_assumes_proportional() -> None:
    p = predict_max_batch([(4, 8 * GiB)], 16 * GiB, headroom=0.0)
    assert p.fixed == 0.0
    assert p.per_sample == pytest.approx(2 * GiB)
    assert p.batch == 8
    assert "proportional" in p.basis


def test_one_point_and_oom_bound() -> None:
    # Measured 12 GiB at batch 4; batch 16 ran out of 20 GiB: slope ≥ (20 − 12) / 12 GiB.
    p = predict_max_batch([(4, 12 * GiB)], 20 * GiB, headroom=0.0, oom_at=[16])
    assert p.per_sample == pytest.approx(8 * GiB / 12)
    assert p.batch is not None and 4 <= p.batch < 16
    assert "OOM at 16" in p.basis


def test_flat_measurements_do_not_extrapolate() -> None:
    p = predict_max_batch([(2, 10 * GiB), (4, 10 * GiB)], 24 * GiB, oom_at=[32])
    assert p.batch == 31
    assert "do not grow" in p.basis
    assert predict_max_batch([(2, 10 * GiB), (4, 9 * GiB)], 24 * GiB).batch is None


def test_no_evidence() -> None:
    assert predict_max_batch([], 24 * GiB).batch is None
    assert predict_max_batch(line(GiB, GiB, [1, 2]), None).basis == "capacity unknown"
    with pytest.raises(ValueError, match="headroom must be in"):
        predict_max_batch([], GiB, headroom=1.0)


def test_to_dict_is_plain() -> None:
    d = predict_max_batch(line(GiB, GiB, [1, 2]), 8 * GiB).to_dict()
    assert set(d) == {
        "batch",
        "fixed",
        "per_sample",
        "capacity",
        "headroom",
        "basis",
        "headroom_on",
        "fixed_at_least",
    }
    assert Prediction(**d).batch == d["batch"]


@given(
    fixed=st.integers(min_value=0, max_value=40 * GiB),
    per_sample=st.integers(min_value=MiB, max_value=4 * GiB),
    capacity=st.integers(min_value=GiB, max_value=141 * GiB),
    headroom=st.floats(min_value=0.0, max_value=0.3),
)
def test_predicted_batch_fits_the_budget(fixed: int, per_sample: int, capacity: int, headroom: float) -> None:
    p = predict_max_batch(line(fixed, per_sample, [1, 3, 7]), capacity, headroom=headroom)
    assert p.batch is not None
    # Largest: b fits with the headroom on what the samples add, b + 1 does not (small
    # tolerance for the float fit).
    padded = [fixed + per_sample * b * (1 + headroom) for b in (p.batch, p.batch + 1)]
    assert p.batch == 0 or padded[0] <= capacity + 1024
    assert padded[1] > capacity - 1024


def test_an_oom_at_the_measured_size_outweighs_the_lower_steps_before_it() -> None:
    """Three short-text steps at 16 peaked at 0.90 GB, then a long-text step at 16 ran out of the
    1.93 GB: the worst peak at 16 is the capacity, not the 0.90 GB. The line goes through it —
    16 / 1.08 → 14 fit, where the line through the early steps said 15 (capped by the OOM) with
    half the memory to spare."""
    capacity, early = 1_932_735_283, 897_818_624
    for fixed in (None, 855_855_104):
        p = predict_max_batch([(16, early)] * 3, capacity, oom_at=[16], fixed_at_least=fixed)
        assert p.batch == 14, p
        assert p.basis == "the OOM at 16, over what its earlier steps at 16 measured"
        assert p.peak_at(16) == pytest.approx(capacity)
        assert p.fixed == (fixed or 0.0)
