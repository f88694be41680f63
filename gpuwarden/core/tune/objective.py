"""What a tune maximises: throughput, energy per sample, or both (the energy-delay product).

- `throughput`: samples/s.
- `energy`: samples per joule (the inverse of J/sample), from the GPU's energy counter.
- `balanced`: samples/s divided by J/sample, i.e. the inverse of the energy-delay product per
  sample — a configuration twice as fast at the same J/sample, or as fast at half the J/sample,
  scores twice as high, so neither figure can be bought with an equal loss in the other.
"""

from __future__ import annotations

from typing import Literal, get_args

Objective = Literal["throughput", "energy", "balanced"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
# Joules in a kilowatt-hour: samples/kWh = 3.6e6 / (J/sample).
J_PER_KWH = 3.6e6


def needs_energy(objective: Objective) -> bool:
    """True when the objective cannot be scored without an energy reading."""
    return objective != "throughput"


def score(objective: Objective, samples_per_s: float | None, joules_per_sample: float | None) -> float | None:
    """Higher is better; None when the reading cannot be scored for this objective."""
    if samples_per_s is None or samples_per_s <= 0:
        return None
    if objective == "throughput":
        return samples_per_s
    if joules_per_sample is None or joules_per_sample <= 0:
        return None
    if objective == "energy":
        return 1.0 / joules_per_sample
    return samples_per_s / joules_per_sample


def samples_per_kwh(joules_per_sample: float | None) -> float | None:
    """Samples one kilowatt-hour buys at this J/sample."""
    if joules_per_sample is None or joules_per_sample <= 0:
        return None
    return J_PER_KWH / joules_per_sample


def unit(objective: Objective) -> str:
    """How the objective's score reads in messages."""
    return {"throughput": "samples/s", "energy": "samples/J", "balanced": "samples²/(s·J)"}[objective]
