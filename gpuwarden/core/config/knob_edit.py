"""Which knobs a change to a run may name: the ones it has.

The API's edit and the dashboard's dialog refuse any other name with the same line, so a typo
never becomes a knob that nothing reads while the one meant keeps its old value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpuwarden.core.config.spec_command import KnobValue
from gpuwarden.core.errors import UserError


def not_a_knob(name: str, knobs: Collection[str], kind: str) -> str:
    """The one line refusing `name`, listing the run's knobs (and, for a train or infer run
    without any, where its settings are changed instead)."""
    if knobs:
        return f"'{name}' is not a knob of this run (its knobs: {', '.join(knobs)})"
    if kind in ("train", "infer"):
        return (
            f"'{name}' is not a knob of this run (it has none — a {kind} run's settings are keys "
            f"such as {kind}.batch_size: set them by that name)"
        )
    return f"'{name}' is not a knob of this run (it has none)"


def check_knob_names(names: Collection[str], knobs: Collection[str], kind: str) -> None:
    """UserError naming the first of `names` that is not one of the run's `knobs`."""
    unknown = [name for name in names if name not in knobs]
    if unknown:
        raise UserError(not_a_knob(unknown[0], knobs, kind))


def merged_knobs(
    knobs: Mapping[str, KnobValue], given: Mapping[str, KnobValue | None], kind: str
) -> dict[str, KnobValue]:
    """The run's knobs with `given` over them; a null removes a knob. The knobs not given keep
    their values: a client that sends the one it changes loses none of the others."""
    check_knob_names(list(given), list(knobs), kind)
    merged = {**knobs, **given}
    return {name: value for name, value in merged.items() if value is not None}
