"""When a tune's pick stands out from the noise, and when noise could have made it.

A tune compares readings taken at different moments on a shared machine; under load one lucky
reading can win by several times and, remembered, be reused by every later tune. The rule:

- the noise is the median, over the candidates read more than once, of the relative spread of
  their readings ((highest − lowest) / mean): what one candidate's readings typically differ by;
- a candidate's band is its mean ± half the noise over √(its readings): averaging n readings
  narrows it as √n;
- another candidate is a rival of the pick when its band's top reaches the pick's band's bottom
  raised by `min_gain`: within the noise it could be better by the gain the search asks of a
  change (differences below `min_gain` are ties to the search, and must not unsettle a plateau);
- the setting tuned from is a rival while the pick does not beat it beyond the noise (their
  bands overlap): a tune changes a setting only on evidence;
- a pick read only once, where the noise is unknown (nothing was read twice) or above
  `min_gain`, is not settled either: its one reading may come from a quieter moment than the
  others', so the best of them is a rival. (Where repeated readings agree within `min_gain`, one
  reading is trusted: re-reading every pick would cost two probes in most searches.)

The search then re-measures the pick and its strongest rivals, interleaved, a bounded number of
rounds, and from then on compares them on those readings only — taken at the same moments, so
drift of the machine's load weighs on all of them. A pick still with rivals is uncertain: the
first measured of them is kept (a change only when it beats what was there beyond the noise) and
not remembered.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Standing:
    """One candidate's scores so far (higher is better), in the order they were read."""

    label: str
    scores: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores)

    def band(self, noise: float | None) -> tuple[float, float]:
        """(lowest, highest) score the candidate could have, within the noise."""
        half = self.mean * (noise or 0.0) / (2 * math.sqrt(len(self.scores)))
        return self.mean - half, self.mean + half


def could_beat(other: Standing, pick: Standing, noise: float | None, min_gain: float) -> bool:
    """True when, within the noise, `other` could be better than `pick` by `min_gain` or more."""
    return other.band(noise)[1] >= pick.band(noise)[0] * (1.0 + min_gain)


def overlaps(other: Standing, pick: Standing, noise: float | None) -> bool:
    """True when the pick does not beat `other` beyond the noise (their bands overlap)."""
    return other.band(noise)[1] >= pick.band(noise)[0]


def noise_level(spreads: list[float]) -> float | None:
    """The noise the rule uses: the median relative spread of the candidates read repeatedly
    (None when none was): one busy moment widens one candidate's spread, not every band."""
    return statistics.median(spreads) if spreads else None


def rivals(
    pick: Standing,
    others: list[Standing],
    noise: float | None,
    min_gain: float,
    *,
    start: str | None = None,
    read_once: bool = False,
) -> list[Standing]:
    """The others noise could have put ahead of the pick, the strongest (highest band top) first.
    `start` names the setting tuned from: the pick replaces it only when it beats it beyond the
    noise, so it is a rival while their bands overlap. `read_once`: the pick has one reading."""
    found = [
        o
        for o in others
        if could_beat(o, pick, noise, min_gain) or (o.label == start and overlaps(o, pick, noise))
    ]
    if not found and others and read_once and (noise is None or noise >= min_gain):
        found = [max(others, key=lambda o: o.mean)]  # read it again beside the next best
    return sorted(found, key=lambda o: o.band(noise)[1], reverse=True)


def names(labels: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def within_noise_line(
    labels: list[str], noise: float | None, kept: str, rounds: int, *, kept_own: bool
) -> str:
    """What a tune says of an uncertain pick, in one line."""
    # The median spread, not the largest a tune reports as the noise seen: what the rule used.
    seen = f"repeated readings typically {100 * noise:.1f} % apart" if noise is not None else "unknown"
    after = f" after {rounds} interleaved re-measure round{'s' if rounds != 1 else ''}" if rounds else ""
    which = "the setting tuned from" if kept_own else "the search's pick"
    return (
        f"micro-batch {names(labels)} are within the noise ({seen}){after}: kept {kept}, {which}; "
        "not remembered — the next tune measures again"
    )


def settled_line(labels: list[str], pick: str, rounds: int, min_gain: float) -> str:
    """What a tune says when re-measuring settled the pick."""
    times = "once" if rounds == 1 else f"{rounds} times"
    return (
        f"re-measured {names(labels)} {times}, interleaved: {pick} kept, no other within the noise "
        f"of beating it by {100 * min_gain:.0f} %"
    )
