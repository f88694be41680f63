"""A linear memory model: peak(b) ≈ fixed + per_sample × b, for one run's fixed shapes.

Weights, gradients and optimizer state are the fixed part; activations grow with the
micro-batch. Fitting the line from the run's own measured peaks lets a retune jump straight to
the largest micro-batch that fits (minus headroom) instead of halving blindly, and an OOM at a
batch size is evidence too: the peak there exceeded the capacity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_HEADROOM = 0.08


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

    @property
    def budget(self) -> float | None:
        """Bytes the peak may reach: capacity less the headroom."""
        return None if self.capacity is None else self.capacity * (1.0 - self.headroom)

    def peak_at(self, batch: int) -> float | None:
        """The modelled peak at `batch`, where the line is known."""
        if self.fixed is None or self.per_sample is None:
            return None
        return self.fixed + self.per_sample * batch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, recorded by the daemon next to the outcome of the attempt."""
        return asdict(self)


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


def _largest_fitting(budget: float, fixed: float, per_sample: float) -> int:
    if budget <= fixed:
        return 0
    return max(0, math.floor((budget - fixed) / per_sample))


def predict_max_batch(
    points: Sequence[tuple[int, int]],
    capacity: int | None,
    headroom: float = DEFAULT_HEADROOM,
    oom_at: Sequence[int] = (),
) -> Prediction:
    """The largest micro-batch whose modelled peak stays under capacity × (1 − headroom).

    `points` are (micro_batch, peak_bytes) measured by the run; `oom_at` are micro-batches that
    ran out of memory. An OOM at b means fixed + per_sample × b > capacity, which bounds the
    slope from below and caps the prediction at b − 1.
    """
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if capacity is None or capacity <= 0:
        return Prediction(None, None, None, capacity, headroom, "capacity unknown")
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
        )
    if fit is not None:
        fixed, per_sample, basis = _fitted(fit, len(peaks), capacity, smallest_oom)
    elif len(peaks) == 1:
        fixed, per_sample, basis = _through_one_point(*next(iter(peaks.items())), capacity, smallest_oom)
    else:
        return Prediction(None, None, None, capacity, headroom, "no measured peaks")
    batch = _largest_fitting(capacity * (1.0 - headroom), fixed, per_sample)
    if smallest_oom is not None and batch >= smallest_oom:
        batch = smallest_oom - 1
        basis += f", capped below the OOM at {smallest_oom}"
    return Prediction(batch, fixed, per_sample, capacity, headroom, basis)


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
    batch: int, peak: int, capacity: int, smallest_oom: int | None
) -> tuple[float, float, str]:
    """(fixed, per_sample, basis) of a line through the one measured (batch, peak)."""
    if smallest_oom is not None and smallest_oom > batch and capacity > peak:
        # The line passes through (batch, peak) and above (b_oom, capacity); the slope is at
        # least the one through both, so this is an upper estimate of what fits.
        per_sample = (capacity - peak) / (smallest_oom - batch)
        return (
            peak - per_sample * batch,
            per_sample,
            f"one measured point ({batch}) and the OOM at {smallest_oom}",
        )
    # With nothing but one point, assume every byte scales with the batch: of all
    # lines through the point this one predicts the smallest batch above it.
    return 0.0, peak / batch, f"one measured point ({batch}), assumed proportional"


__all__ = ["DEFAULT_HEADROOM", "Prediction", "fit_line", "predict_max_batch", "worst_peaks"]
