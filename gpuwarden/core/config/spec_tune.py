"""The run spec's `tune:` section: what `gpuwarden tune` and `autotune: true` optimise for."""

from __future__ import annotations

from pydantic import Field

from gpuwarden.core.config.validation import StrictModel
from gpuwarden.core.tune.objective import Objective


class TuneSettings(StrictModel):
    """How the tuner chooses between the configurations it probes."""

    objective: Objective = Field(
        "throughput",
        description="throughput (samples/s), energy (joules per sample, from the GPU's energy "
        "counter) or balanced (samples/s per J/sample)",
    )
    power_sweep: bool = Field(
        False,
        description="also probe lower GPU power limits (needs root or `power_limit_command`); the "
        "best limit is reported, not applied",
    )
