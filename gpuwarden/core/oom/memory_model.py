"""A linear memory model: peak(b) ≈ fixed + per_sample × b, for one run's fixed shapes.

Weights, gradients and optimizer state are the fixed part; activations grow with the
micro-batch. Fitting the line from the run's own measured peaks lets a retune jump straight to
the largest micro-batch that fits instead of halving blindly, and an OOM at a batch size is
evidence too: the peak there exceeded the capacity.

The headroom pads what grows with the micro-batch (activations: where a longer sequence or an
evaluation step peaks higher), not the fixed part, which the line measured at every point: 8 % of
a 2.8 GiB limit is 230 MiB, more than several samples' activations, and taken from the whole
limit it turned a micro-batch of 16 that ran into a prediction of 9. Where the failure was the
allocator's fragmentation the waste grows with everything held, so there the headroom pads the
whole peak (`HEADROOM_ON_PEAK`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuwarden.core.units import size

DEFAULT_HEADROOM = 0.08
HEADROOM_ON_SAMPLES = "per_sample"  # the part that grows with the micro-batch
HEADROOM_ON_PEAK = "peak"  # the whole peak: fragmentation grows with everything held


@dataclass(frozen=True)
class Prediction:
    """The largest micro-batch expected to fit, and the line and evidence behind it.

    `batch` is None when there is not enough evidence to predict, and 0 when the model says even
    one sample does not fit under the budget.
    """

    batch: int | None
    fixed: float | None
    per_sample: float | None
    capacity: int | None
    headroom: float
    basis: str
    headroom_on: str = HEADROOM_ON_SAMPLES
    # What the run holds whatever the micro-batch, as it reported (None where it did not)
    fixed_at_least: int | None = None

    def padded_peak(self, batch: int) -> float | None:
        """The modelled peak at `batch` with the headroom added where it applies."""
        if self.fixed is None or self.per_sample is None:
            return None
        if self.headroom_on == HEADROOM_ON_PEAK:
            return (self.fixed + self.per_sample * batch) / (1.0 - self.headroom)
        return self.fixed + self.per_sample * batch * (1.0 + self.headroom)

    def spare_at(self, batch: int) -> float | None:
        """The share of the capacity the modelled peak at `batch` leaves free (0.06: 6 %)."""
        peak = self.peak_at(batch)
        if peak is None or not self.capacity:
            return None
        return (self.capacity - peak) / self.capacity

    def peak_at(self, batch: int) -> float | None:
        """The modelled peak at `batch`, where the line is known."""
        if self.fixed is None or self.per_sample is None:
            return None
        return self.fixed + self.per_sample * batch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, recorded by the daemon next to the outcome of the attempt."""
        return asdict(self)


def headroom_on(verdict: str) -> str:
    """Where the headroom goes for a failure: the whole peak where the allocator's fragmentation
    ran out, else the part that grows with the micro-batch."""
    return HEADROOM_ON_PEAK if verdict == "gpu_fragmentation" else HEADROOM_ON_SAMPLES


def worst_peaks(points: Iterable[tuple[int, int]]) -> dict[int, int]:
    """The highest peak seen per micro-batch size: longer sequences and evaluation steps peak
    higher than the average step, and the model must hold for the worst one."""
    out: dict[int, int] = {}
    for batch, peak in points:
        if batch <= 0 or peak < 0:
            continue
        out[batch] = max(out.get(batch, 0), peak)
    return out


def fit_line(points: Iterable[tuple[int, int]]) -> tuple[float, float] | None:
    """Least-squares (fixed, per_sample) over the worst peak of each distinct batch size.

    None with fewer than two distinct batch sizes: one point does not fix a line.
    """
    peaks = worst_peaks(points)
    if len(peaks) < 2:
        return None
    xs = list(peaks)
    ys = [float(peaks[x]) for x in xs]
    n = len(xs)
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def _largest_fitting(capacity: int, fixed: float, per_sample: float, headroom: float, on: str) -> int:
    """Largest b with fixed + per_sample × b × (1 + headroom) ≤ capacity (on the samples), or
    fixed + per_sample × b ≤ capacity × (1 − headroom) (on the whole peak)."""
    if on == HEADROOM_ON_PEAK:
        room, cost = capacity * (1.0 - headroom) - fixed, per_sample
    else:
        room, cost = capacity - fixed, per_sample * (1.0 + headroom)
    if room <= 0:
        return 0
    # A ratio that is a whole number in exact arithmetic may land a hair below it in floats.
    return max(0, math.floor(room / cost + 1e-9))


def predict_max_batch(
    points: Sequence[tuple[int, int]],
    capacity: int | None,
    headroom: float = DEFAULT_HEADROOM,
    oom_at: Sequence[int] = (),
    headroom_on: str = HEADROOM_ON_SAMPLES,
    fixed_at_least: int | None = None,
) -> Prediction:
    """The largest micro-batch whose modelled peak, with the headroom added to the part that
    grows with the batch (`headroom_on` "peak": to the whole peak), stays under capacity.

    `points` are (micro_batch, peak_bytes) measured by the run; `oom_at` are micro-batches that
    ran out of memory. An OOM at b means fixed + per_sample × b > capacity, which bounds the
    slope from below and caps the prediction at b − 1. `fixed_at_least` is what the run said
    it holds whatever the micro-batch (weights, gradients, optimizer state): at or above the
    capacity nothing fits; below it, it is the line's least intercept where one point leaves the
    line open.
    """
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if headroom_on not in (HEADROOM_ON_SAMPLES, HEADROOM_ON_PEAK):
        raise ValueError(
            f"headroom_on must be {HEADROOM_ON_SAMPLES!r} or {HEADROOM_ON_PEAK!r}, got {headroom_on!r}"
        )
    if capacity is None or capacity <= 0:
        return Prediction(None, None, None, capacity, headroom, "capacity unknown", headroom_on)
    if fixed_at_least is not None and fixed_at_least >= capacity:
        basis = f"the weights, gradients and optimizer state alone take at least {size(fixed_at_least)}"
        fixed = float(fixed_at_least)
        return Prediction(0, fixed, None, capacity, headroom, basis, headroom_on, fixed_at_least)
    smallest_oom = min((b for b in oom_at if b > 0), default=None)
    peaks = worst_peaks(points)
    fit = fit_line(points)
    if fit is not None and fit[1] <= 0:
        # Peak did not grow with the batch: measurement noise or a constant-memory step.
        # Extrapolating a flat line would promise any batch fits, which an OOM disproves.
        return Prediction(
            None if smallest_oom is None else smallest_oom - 1,
            *fit,
            capacity,
            headroom,
            "measured peaks do not grow with the batch size; no extrapolation",
            headroom_on,
        )
    if fit is not None:
        fixed, per_sample, basis = _fitted(fit, len(peaks), capacity, smallest_oom)
    elif len(peaks) == 1:
        fixed, per_sample, basis = _through_one_point(
            *next(iter(peaks.items())), capacity, smallest_oom, fixed_at_least
        )
    else:
        return Prediction(None, None, None, capacity, headroom, "no measured peaks", headroom_on)
    batch = _largest_fitting(capacity, fixed, per_sample, headroom, headroom_on)
    if smallest_oom is not None and batch >= smallest_oom:
        batch = smallest_oom - 1
        basis += f", capped below the OOM at {smallest_oom}"
    return Prediction(batch, fixed, per_sample, capacity, headroom, basis, headroom_on, fixed_at_least)


def _fitted(
    fit: tuple[float, float], batch_sizes: int, capacity: int, smallest_oom: int | None
) -> tuple[float, float, str]:
    """(fixed, per_sample, basis) of a rising least-squares line, made consistent with the OOM."""
    fixed, per_sample = fit
    basis = f"least-squares fit over {batch_sizes} batch sizes"
    if smallest_oom is not None and fixed + per_sample * smallest_oom <= capacity:
        # The line says the OOM batch fits, so it underestimates: steepen it just enough
        # to pass through (b_oom, capacity), keeping the intercept.
        per_sample = max(per_sample, (capacity - fixed) / smallest_oom)
        basis += f", steepened by the OOM at {smallest_oom}"
    return fixed, per_sample, basis


def _through_one_point(
    batch: int, peak: int, capacity: int, smallest_oom: int | None, fixed_at_least: int | None = None
) -> tuple[float, float, str]:
    """(fixed, per_sample, basis) of a line through the one measured (batch, peak)."""
    if smallest_oom == batch and capacity > peak:
        # A later step at the measured size ran out (longer inputs, an evaluation): its worst
        # peak there is at least the capacity, which the steps measured before it understate.
        floor = float(fixed_at_least) if fixed_at_least is not None and 0 < fixed_at_least < capacity else 0.0
        basis = f"the OOM at {batch}, over what its earlier steps at {batch} measured"
        return floor, (capacity - floor) / batch, basis
    if smallest_oom is not None and smallest_oom > batch and capacity > peak:
        # The line passes through (batch, peak) and above (b_oom, capacity); the slope is at
        # least the one through both, so this is an upper estimate of what fits.
        per_sample = (capacity - peak) / (smallest_oom - batch)
        return (
            peak - per_sample * batch,
            per_sample,
            f"one measured point ({batch}) and the OOM at {smallest_oom}",
        )
    if fixed_at_least is not None and 0 < fixed_at_least < peak:
        # The true intercept is at least what the run holds whatever the batch; of the lines
        # through the point the one with the least such intercept predicts the smallest batch
        # above it, so this stays on the safe side, closer than the proportional line.
        return (
            float(fixed_at_least),
            (peak - fixed_at_least) / batch,
            f"one measured point ({batch}) above the fixed memory reported",
        )
    # With nothing but one point, assume every byte scales with the batch: of all
    # lines through the point this one predicts the smallest batch above it.
    return 0.0, peak / batch, f"one measured point ({batch}), assumed proportional"


__all__ = [
    "DEFAULT_HEADROOM",
    "HEADROOM_ON_PEAK",
    "HEADROOM_ON_SAMPLES",
    "Prediction",
    "fit_line",
    "headroom_on",
    "predict_max_batch",
    "worst_peaks",
]
