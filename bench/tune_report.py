"""The rows of `bench tune`, from readings taken in one run, and when the noise leaves them
saying nothing.

A sweep taken at another time (another load) is no yardstick: a cold run once read picks at
16–522 % of a sweep cached from a busier hour. So the picks and the sweep's best are read again
in turns in one run (a round: each of them once), each configuration's figure is the median of
its readings over the rounds, and a row whose readings spread more than its comparison can
resolve says so instead of a verdict: the throughput comparison needs readings that agree within
5 % (its target is ≥ 95 %); the time comparison needs them to agree
within the distance between its figure and its target.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.figures import figure_row

SHARE_TARGET_PCT = 95.0
TIME_TARGET_PCT = 100.0 / 3
# The throughput target tells apart picks 5 % apart: readings must agree at least that well.
SHARE_NEEDS_PCT = 100.0 - SHARE_TARGET_PCT

# One sweep round: configuration name → samples/s (None where it failed or ran out of memory).
Round = Mapping[str, float | None]


@dataclass(frozen=True)
class SearchRun:
    """One search of the benchmark: what it picked and what it cost."""

    pick: str
    wall_s: float
    probes: int
    uncertain: bool = False
    repeat_spread: float | None = None


def spread_pct(values: Sequence[float]) -> float:
    """(highest − lowest) / median, in %."""
    middle = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / middle if middle else 0.0


def medians(rounds: Sequence[Round]) -> dict[str, float]:
    """Each configuration's median samples/s over the rounds; one that failed in any round is
    left out (it cannot be the best, and no search may keep it)."""
    names = [name for name in rounds[0] if all(r.get(name) for r in rounds)]
    return {name: statistics.median([float(r[name] or 0.0) for r in rounds]) for name in names}


def reading_spreads(rounds: Sequence[Round]) -> dict[str, float]:
    """Each configuration's spread over the rounds, in % (none with a single round)."""
    if len(rounds) < 2:
        return {}
    return {name: spread_pct([float(r[name] or 0.0) for r in rounds]) for name in medians(rounds)}


def verdict_or_why_not(
    spread: float | None, needs: float, target: str, check: Callable[[float], bool]
) -> tuple[str, Callable[[float], bool] | None]:
    """(target text, check): the check only when the readings agree as well as the comparison
    needs; else the target says why the row gives no verdict."""
    if spread is None or spread <= needs:
        return target, check
    why = f"spread {spread:.0f} % > the {needs:.0f} % the comparison needs: not meaningful at this load"
    return f"{target} — {why}", None


def rows(
    rounds: Sequence[Round],
    round_walls: Sequence[float],
    searches: Sequence[SearchRun],
    *,
    space: str,
    measured: str,
    configurations: int | None = None,
) -> list[dict[str, Any]]:
    """The benchmark's rows: pick / sweep's best, tune's time / a sweep round's, the noise.
    `configurations`: how many a sweep round probes (default: as many as a round holds)."""
    figures = medians(rounds)
    if not figures:
        raise RuntimeError("no configuration of the sweep ran in every round")
    missing = [s.pick for s in searches if s.pick not in figures]
    if missing:
        raise RuntimeError(f"a search picked {missing[0]}, which the sweep has no reading of in every round")
    spreads = reading_spreads(rounds)
    highest = {name: max(float(r[name] or 0.0) for r in rounds) for name in figures}
    out = [
        _share_row(figures, highest, spreads, searches, f"tune vs sweep ({space}; {measured})"),
        _time_row(round_walls, searches, configurations or len(rounds[0])),
    ]
    if len(spreads) >= 3:
        name = "sweep: spread of one configuration's readings over the rounds"
        out.append(figure_row(name, list(spreads.values()), "%"))
    repeats = [100 * s.repeat_spread for s in searches if s.repeat_spread is not None]
    if len(repeats) >= 3:
        out.append(figure_row("tune: spread of the readings it repeated", repeats, "%"))
    return out


def _share_row(
    figures: Mapping[str, float],
    highest: Mapping[str, float],
    spreads: Mapping[str, float],
    searches: Sequence[SearchRun],
    what: str,
) -> dict[str, Any]:
    """Each pick's figure over the best one's. The spread it rests on is that of the picks', the
    best's, and any configuration's that once read as high as the best (it could be the best)."""
    best = max(figures, key=lambda name: figures[name])
    contenders = {best, *(s.pick for s in searches), *(n for n in figures if highest[n] >= figures[best])}
    rested_on = [spreads[n] for n in contenders if n in spreads]
    target, check = verdict_or_why_not(
        max(rested_on, default=None), SHARE_NEEDS_PCT, "≥ 95", lambda v: v >= SHARE_TARGET_PCT
    )
    uncertain = sum(s.uncertain for s in searches)
    said = f"; {uncertain} of {len(searches)} within the noise, not remembered" if uncertain else ""
    return figure_row(
        f"{what}: pick / sweep's best, samples/s, each the median of its readings (picks "
        f"{', '.join(s.pick for s in searches)} vs {best}{said})",
        [100.0 * figures[s.pick] / figures[best] for s in searches],
        "%",
        target=target,
        check=check,
    )


def _time_row(
    round_walls: Sequence[float], searches: Sequence[SearchRun], configurations: int
) -> dict[str, Any]:
    """Each search's probe time over a sweep round's (the median round); a verdict only when the
    rounds' times agree better than the figure's distance from its target."""
    sweep_s = statistics.median(round_walls)
    times = [100.0 * s.wall_s / sweep_s for s in searches]
    margin = abs(statistics.median(times) - TIME_TARGET_PCT) / TIME_TARGET_PCT * 100
    spread = spread_pct(round_walls) if len(round_walls) > 1 else None
    target, check = verdict_or_why_not(spread, margin, "≤ 33.3", lambda v: v <= TIME_TARGET_PCT)
    return figure_row(
        f"tune vs sweep: time ({statistics.median([s.probes for s in searches]):.0f} probes vs "
        f"{configurations} in a sweep round; a round {sweep_s:.0f} s, median of {len(round_walls)})",
        times,
        "% of a sweep round's",
        target=target,
        check=check,
    )
