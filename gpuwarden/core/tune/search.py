"""The search itself, pure: it decides what to probe next; an injected function runs the probe.

Rules, from the failures of other finders:
- the objective is throughput (samples/s), energy (samples per joule) or both (`objective.py`),
  never utilisation;
- a candidate counts only with its peak memory under capacity × (1 − headroom): Lightning's
  finder picked sizes that fit a 3-step probe and ran out of memory later;
- the micro-batch grows geometrically (×3, then one probe in each gap next to the best), and the
  memory model (fitted on the probes so far) skips
  candidates it predicts would not fit, so no probe is wasted on a certain OOM;
- the search stops when a step up gains less than `min_gain` (DeepSpeed's autotuner: < 5 %), but
  not on one reading: timings on a shared machine drift as other jobs start and end, and one
  lucky reading of a small micro-batch on a flat curve once ended the search below the plateau.
  Before stopping it measures once more — the miss when it read clearly slower than the
  incumbent, else the incumbent — and a miss whose mean then gains `min_gain` takes the lead and
  the ladder goes on above it. The spread of repeated readings is reported as the noise the search saw;
- a pick that noise could have made is not trusted (`noise.py`): the pick and its rivals are
  measured again, interleaved, at most `settle_rounds` times; one still within the noise keeps the
  first measured of them and is marked uncertain (the session does not remember it);
- with the effective batch kept, candidates are the divisors of the per-device batch, so that
  micro-batch × accumulation stays exactly equal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpuwarden.core.oom.memory_model import DEFAULT_HEADROOM, predict_max_batch
from gpuwarden.core.tune import noise as noise_rule
from gpuwarden.core.tune.objective import Objective, samples_per_kwh, score
from gpuwarden.core.units import size


@dataclass(frozen=True)
class Candidate:
    """One configuration to probe."""

    batch_size: int
    grad_accum_steps: int
    precision: str
    compile: bool
    power_limit_w: float | None = None  # set only by the power-limit sweep

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["power_limit_w"] is None:
            del d["power_limit_w"]
        return d


@dataclass(frozen=True)
class ProbeResult:
    """What one probe process measured (after its warm-up steps), or several combined.

    `joules_per_sample` and `power_w` come from the GPU's energy counter over the measured steps
    (None without one); `step_spread` is the relative spread of the per-step rates inside the
    probe; `readings` > 1 marks the mean of repeated probes of one candidate.
    """

    candidate: Candidate
    ok: bool
    oom: bool = False
    samples_per_s: float | None = None
    mem_peak: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    # The runner said the spec cannot run as written (exit 2): no other micro-batch runs either.
    spec_error: bool = False
    joules_per_sample: float | None = None
    power_w: float | None = None
    step_spread: float | None = None
    readings: int = 1

    @property
    def samples_per_kwh(self) -> float | None:
        return samples_per_kwh(self.joules_per_sample)

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "candidate": self.candidate.to_dict()}
        d["samples_per_kwh"] = self.samples_per_kwh
        return d


ProbeFn = Callable[[Candidate], ProbeResult]

# Rivals re-measured beside the pick in one round (the best ones): a bound on the extra probes.
MAX_RIVALS = 2


@dataclass
class Settling:
    """How the pick was checked against the noise: the rounds of interleaved re-measures, the
    probes they took, and — when uncertain — the candidates still within the noise."""

    rounds: int = 0
    probes: int = 0
    groups: list[list[str]] = field(default_factory=list)  # each round's probes, in order
    remeasured: list[str] = field(default_factory=list)
    within_noise: list[str] = field(default_factory=list)
    kept: str | None = None
    says: str | None = None

    @property
    def uncertain(self) -> bool:
        return bool(self.within_noise)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "uncertain": self.uncertain}


@dataclass
class TuneResult:
    best: ProbeResult | None
    trials: list[ProbeResult] = field(default_factory=list)
    stopped_because: str = ""
    capacity: int | None = None
    headroom: float = DEFAULT_HEADROOM
    objective: Objective = "throughput"
    noise: dict[str, Any] = field(default_factory=dict)
    settling: Settling = field(default_factory=Settling)

    @property
    def uncertain(self) -> bool:
        """True when noise could have made the pick: it must not be remembered."""
        return self.settling.uncertain

    @property
    def wall_s(self) -> float:
        return sum(t.wall_s for t in self.trials)

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict() if self.best else None,
            "trials": [t.to_dict() for t in self.trials],
            "stopped_because": self.stopped_because,
            "capacity": self.capacity,
            "headroom": self.headroom,
            "objective": self.objective,
            "noise": self.noise,
            "settling": self.settling.to_dict(),
            "uncertain": self.uncertain,
            "wall_s": self.wall_s,
        }


def divisors(n: int) -> list[int]:
    """All divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def batch_ladder(start: int, per_device_batch: int | None, max_batch: int, factor: float = 3.0) -> list[int]:
    """Micro-batches worth probing above `start`, each about `factor` times the one before.

    With the effective batch kept (`per_device_batch` = micro × accumulation), only its divisors
    qualify: each step takes the smallest divisor at least `factor` times the previous one (and
    the largest divisor last), so the ladder never stalls on 7, 8, 9 …. A coarse ladder costs few
    probes; `Search._refine` then looks between the rungs next to the best one.
    """
    if per_device_batch is None:
        options = list(range(start + 1, max_batch + 1))
    else:
        options = [d for d in divisors(per_device_batch) if start < d <= max_batch]
    ladder: list[int] = []
    last = start
    for d in options:
        if d >= factor * last or (per_device_batch is not None and d == options[-1]):
            ladder.append(d)
            last = d
    return ladder


def combine(readings: list[ProbeResult]) -> ProbeResult:
    """Repeated readings of one candidate as one result: mean rates, the worst peak, the sum of
    the time spent."""
    if len(readings) == 1:
        return readings[0]

    def mean_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    peaks = [r.mem_peak for r in readings if r.mem_peak is not None]
    spreads = [r.step_spread for r in readings if r.step_spread is not None]
    return replace(
        readings[-1],
        samples_per_s=mean_of([r.samples_per_s for r in readings]),
        joules_per_sample=mean_of([r.joules_per_sample for r in readings]),
        power_w=mean_of([r.power_w for r in readings]),
        mem_peak=max(peaks) if peaks else None,
        step_spread=max(spreads) if spreads else None,
        wall_s=sum(r.wall_s for r in readings),
        readings=len(readings),
    )


class Search:
    """Runs the search; `probe` is called once per trial, in order."""

    def __init__(
        self,
        probe: ProbeFn,
        *,
        capacity: int | None,
        headroom: float = DEFAULT_HEADROOM,
        min_gain: float = 0.05,
        max_trials: int = 12,
        factor: float = 3.0,
        patience: int = 0,
        objective: Objective = "throughput",
        settle_rounds: int = 2,
    ) -> None:
        self._probe = probe
        self.settle_rounds = settle_rounds
        self.settling = Settling()
        # Where each re-measured candidate's readings beside the pick begin.
        self._settle_from: dict[Candidate, int] = {}
        self.factor = factor
        self.patience = patience
        self.capacity = capacity
        self.headroom = headroom
        self.min_gain = min_gain
        self.max_trials = max_trials
        self.objective: Objective = objective
        self.trials: list[ProbeResult] = []
        self._readings: dict[Candidate, list[ProbeResult]] = {}

    # ---- readings ----------------------------------------------------------------------------

    def _run(self, c: Candidate) -> ProbeResult:
        r = self._probe(c)
        self.trials.append(r)
        self._readings.setdefault(c, []).append(r)
        return r

    def _score(self, r: ProbeResult) -> float | None:
        return score(self.objective, r.samples_per_s, r.joules_per_sample)

    def _fits(self, r: ProbeResult) -> bool:
        if not r.ok or self._score(r) is None:
            return False
        if self.capacity is None or r.mem_peak is None:
            return True
        return r.mem_peak <= self.capacity * (1.0 - self.headroom)

    def _result(self, c: Candidate) -> ProbeResult | None:
        """The candidate's readings combined, or None when one of them did not fit or failed."""
        readings = self._readings.get(c, [])
        if not readings or not all(self._fits(r) for r in readings):
            return None
        return combine(readings)

    def _mean_score(self, c: Candidate) -> float:
        """The score of the candidate's combined readings; -inf when one did not fit."""
        combined = self._result(c)
        value = self._score(combined) if combined is not None else None
        return value if value is not None else -math.inf

    def _gain(self, new: Candidate, old: Candidate) -> float:
        a, b = self._result(new), self._result(old)
        sa = self._score(a) if a is not None else None
        sb = self._score(b) if b is not None else None
        if sa is None or sb is None or sb <= 0:
            return 0.0
        return sa / sb - 1.0

    def _points(self) -> list[tuple[int, int]]:
        return [(t.candidate.batch_size, t.mem_peak) for t in self.trials if t.ok and t.mem_peak is not None]

    def _ooms(self) -> list[int]:
        return [t.candidate.batch_size for t in self.trials if t.oom]

    def noise(self) -> dict[str, Any]:
        """The noise the search saw: the spread of repeated readings of one candidate (relative
        to their mean) and the median spread of the step rates inside a probe."""
        repeats: dict[str, float] = {}
        for c, readings in self._readings.items():
            scores = [s for s in (self._score(r) for r in readings if self._fits(r)) if s is not None]
            if len(scores) >= 2:
                repeats[_label(c)] = (max(scores) - min(scores)) / statistics.fmean(scores)
        steps = [t.step_spread for t in self.trials if t.step_spread is not None]
        return {
            "repeat_spread": max(repeats.values()) if repeats else None,
            "repeated": repeats,
            "step_spread": statistics.median(steps) if steps else None,
        }

    # ---- the search --------------------------------------------------------------------------

    def run(
        self,
        start: Candidate,
        *,
        per_device_batch: int | None,
        max_batch: int = 4096,
        precisions: list[str] | None = None,
        compile_options: list[bool] | None = None,
    ) -> TuneResult:
        """Search micro-batch upward from `start` (shrinking first if `start` does not fit), then
        the other precisions and compile settings at the best micro-batch; then the pick is
        checked against the noise (`_settle`)."""
        best, why = self._search_batch(start, per_device_batch, max_batch)
        if best is not None:
            best = self._refine(best, start, per_device_batch, max_batch)
            for precision in precisions or []:
                if len(self.trials) < self.max_trials and precision != best.precision:
                    best = self._challenge(best, replace(best, precision=precision))
            for comp in compile_options or []:
                if len(self.trials) < self.max_trials and comp != best.compile:
                    best = self._challenge(best, replace(best, compile=comp))
            best = self._settle(best)
        chosen = self._result(best) if best is not None else None
        return TuneResult(
            chosen,
            list(self.trials),
            why,
            self.capacity,
            self.headroom,
            self.objective,
            self.noise(),
            self.settling,
        )

    # ---- the pick against the noise --------------------------------------------------------------

    def _standing(self, c: Candidate, group: list[Candidate]) -> noise_rule.Standing | None:
        """The candidate's scores — since the re-measure rounds began when it is re-measured in
        them, so that it is compared on readings taken beside the pick's — or None when one of
        its readings did not fit or failed."""
        readings = self._readings.get(c, [])
        if not readings or not all(self._fits(r) for r in readings):
            return None
        scores = [self._score(r) for r in readings[self._settle_from.get(c, 0) :]]
        return noise_rule.Standing(_plain_label(c, group), tuple(s for s in scores if s is not None))

    def _rule_noise(self) -> float | None:
        return noise_rule.noise_level(list(self.noise()["repeated"].values()))

    def _rivals(self, pick: Candidate) -> list[Candidate]:
        """The candidates noise could have put ahead of the pick, strongest first."""
        group = list(self._readings)
        mine = self._standing(pick, group)
        if mine is None:
            return []
        others = {c: s for c in group if c != pick and (s := self._standing(c, group)) is not None}
        start = _plain_label(group[0], group) if group[0] != pick else None
        found = noise_rule.rivals(
            mine,
            list(others.values()),
            self._rule_noise(),
            self.min_gain,
            start=start,
            read_once=len(self._readings[pick]) == 1,
        )
        by_label = {s.label: c for c, s in others.items()}
        return [by_label[s.label] for s in found]

    def _settle(self, pick: Candidate) -> Candidate:
        """Measure the pick and its strongest rivals again, interleaved (so that drift weighs on
        all), at most `settle_rounds` times. A pick still with rivals is uncertain: the setting
        tuned from stays when it is one of them, else the search's pick."""
        rivals = self._rivals(pick)
        while rivals and self.settling.rounds < self.settle_rounds:
            group = [pick, *rivals[:MAX_RIVALS]]
            for c in group:
                self._settle_from.setdefault(c, len(self._readings.get(c, [])))
                self._run(c)
            self.settling.rounds += 1
            self.settling.probes += len(group)
            self.settling.groups.append([_plain_label(c, list(self._readings)) for c in group])
            pick = self._leader(pick, group)
            rivals = self._rivals(pick)
        every = list(self._readings)
        self.settling.remeasured = [_plain_label(c, every) for c in self._settle_from]
        if not rivals:
            if self._settle_from:
                self.settling.says = noise_rule.settled_line(
                    self.settling.remeasured, _plain_label(pick, every), self.settling.rounds, self.min_gain
                )
            return pick
        close = [c for c in every if c == pick or c in rivals]  # in the order first measured
        # Without evidence beyond the noise nothing changes: the setting tuned from stays when it
        # is one of them; else the search's own pick.
        kept = every[0] if every[0] in close else pick
        self.settling.within_noise = [_plain_label(c, every) for c in close]
        self.settling.kept = _plain_label(kept, every)
        self.settling.says = noise_rule.within_noise_line(
            self.settling.within_noise,
            self._rule_noise(),
            self.settling.kept,
            self.settling.rounds,
            kept_own=kept == every[0],
        )
        return kept

    def _leader(self, pick: Candidate, group: list[Candidate]) -> Candidate:
        """After a round: the pick, unless another of the group now gains `min_gain` over it on
        the readings taken side by side (or the pick failed its re-measure)."""
        every = list(self._readings)
        standings = {c: self._standing(c, every) for c in group}
        means = {c: s.mean for c, s in standings.items() if s is not None}
        if not means:
            return pick
        best = max(means, key=lambda c: means[c])
        if pick not in means or means[best] >= means[pick] * (1.0 + self.min_gain):
            return best
        return pick

    def _challenge(self, best: Candidate, other: Candidate) -> Candidate:
        r = self._run(other)
        return other if self._fits(r) and self._gain(other, best) >= self.min_gain else best

    def _at(self, start: Candidate, batch: int, per_device_batch: int | None) -> Candidate:
        accum = start.grad_accum_steps if per_device_batch is None else per_device_batch // batch
        return replace(start, batch_size=batch, grad_accum_steps=accum)

    def _search_batch(
        self, start: Candidate, per_device_batch: int | None, max_batch: int
    ) -> tuple[Candidate | None, str]:
        first = self._run(start)
        if not self._fits(first):
            return self._shrunk_start(start, per_device_batch)
        best = start
        misses: list[Candidate] = []
        confirmed = False
        for batch in batch_ladder(start.batch_size, per_device_batch, max_batch, self.factor):
            if len(self.trials) >= self.max_trials:
                return best, f"reached the trial limit ({self.max_trials})"
            predicted = self._predicted_not_to_fit(batch)
            if predicted is not None:
                return best, predicted
            c = self._at(start, batch, per_device_batch)
            r = self._run(c)
            if not self._fits(r):
                return best, f"micro-batch {batch} {self._why(r)}"
            gain = self._gain(c, best)
            if gain >= self.min_gain:
                best, misses = c, []
                continue
            # Ties keep the smaller micro-batch, which runs as fast with more memory headroom.
            misses.append(c)
            if len(misses) <= self.patience:
                continue
            stop = f"micro-batch {batch} gained {100 * gain:.1f} % (< {100 * self.min_gain:.0f} %)"
            if confirmed or len(self.trials) >= self.max_trials:
                return best, stop
            confirmed = True
            best, stopped = self._recheck(best, misses, c, stop)
            if stopped is not None:
                return best, stopped
            misses = []
        return best, "no larger micro-batch to try"

    def _recheck(
        self, best: Candidate, misses: list[Candidate], last: Candidate, stop: str
    ) -> tuple[Candidate, str | None]:
        """After `patience` misses, one probe more: (the best then, why the ladder stops or None
        when the newest rung took the lead and the climb goes on)."""
        leader, again = self._confirm(best, misses)
        if leader is None:
            return best, stop + self._noise_note(again)
        if leader != last:  # a rung above the leader read lower: the peak is bracketed
            return leader, f"micro-batch {leader.batch_size} led once measured again" + self._noise_note(
                again
            )
        return leader, None

    def _shrunk_start(self, start: Candidate, per_device_batch: int | None) -> tuple[Candidate | None, str]:
        if self.trials[-1].spec_error:
            return None, f"the spec cannot run as written ({self._why(self.trials[-1])})"
        shrunk = self._shrink(start, per_device_batch)
        if shrunk is None:
            why = self._why(self.trials[-1])
            return None, f"even the smallest micro-batch did not fit or failed ({why})"
        return (
            shrunk,
            "the starting micro-batch did not fit; this is the largest that did"
            + self._headroom_note(shrunk),
        )

    def _headroom_note(self, chosen: Candidate) -> str:
        """Why a larger micro-batch that ran is not chosen: it left less free than the headroom
        (a user sees its probe's speed and peak, and would otherwise wonder)."""
        over = [
            t
            for t in self.trials
            if t.candidate.batch_size > chosen.batch_size
            and t.ok
            and self._score(t) is not None
            and not self._fits(t)
        ]
        if not over or self.capacity is None:
            return ""
        t = max(over, key=lambda t: t.candidate.batch_size)
        free = 1.0 - (t.mem_peak or 0) / self.capacity
        return (
            f" (micro-batch {t.candidate.batch_size} ran with a peak of {size(t.mem_peak)}, leaving "
            f"{100 * free:.0f} % of {size(self.capacity)} free: less than the {100 * self.headroom:.0f} % "
            "headroom kept — --headroom sets it)"
        )

    def _predicted_not_to_fit(self, batch: int) -> str | None:
        """Why `batch` is skipped, when the memory model fitted to the probes so far says it will not fit."""
        prediction = predict_max_batch(self._points(), self.capacity, self.headroom, self._ooms())
        if prediction.batch is None or batch <= prediction.batch:
            return None
        return (
            f"micro-batch {batch} is predicted not to fit (largest predicted: {prediction.batch}, "
            f"{prediction.basis})"
        )

    def _confirm(self, best: Candidate, misses: list[Candidate]) -> tuple[Candidate | None, Candidate]:
        """One more probe before stopping: (the miss when it now gains `min_gain`, or None; the
        candidate measured again).

        Timings on a shared machine drift (another job starts or ends between probes). A miss
        that read clearly slower than the incumbent (by `min_gain` or more) may have met such a
        moment: it is measured again. A miss that read about as fast was compared with a single
        reading of the incumbent, which may have been the lucky one: the incumbent is measured
        again. Either way the decision is then taken on the mean of two readings against one,
        for one probe more."""
        leader = max(misses, key=self._mean_score)
        again = leader if self._gain(leader, best) <= -self.min_gain else best
        self._run(again)
        return (leader if self._gain(leader, best) >= self.min_gain else None), again

    def _noise_note(self, again: Candidate) -> str:
        readings = [r for r in self._readings.get(again, []) if self._fits(r)]
        scores = [s for s in (self._score(r) for r in readings) if s is not None]
        if len(scores) < 2:
            return ""
        spread = (max(scores) - min(scores)) / statistics.fmean(scores)
        return f"; micro-batch {again.batch_size} measured twice: readings {100 * spread:.1f} % apart"

    def _refine(
        self, best: Candidate, start: Candidate, per_device_batch: int | None, max_batch: int
    ) -> Candidate:
        """One more probe where the peak most likely is: the coarse ladder can step over it (16 →
        48 → 144 when 24 is fastest). A parabola in log(micro-batch) through the best rung and its
        neighbours says on which side; with one neighbour only, that side's gap is probed."""
        if len(self.trials) >= self.max_trials:
            return best
        measured: dict[int, float] = {}
        for c in self._readings:
            combined = self._result(c)
            value = self._score(combined) if combined is not None else None
            if c.precision == start.precision and value:
                measured[c.batch_size] = value
        probed = {c.batch_size for c in self._readings if c.precision == start.precision}
        b = best.batch_size
        lower = max((p for p in probed if p < b), default=None)
        upper = min((p for p in probed if p > b), default=None)
        prediction = predict_max_batch(self._points(), self.capacity, self.headroom, self._ooms())
        if upper is None and prediction.batch:
            upper = prediction.batch + 1  # the ladder stopped on a prediction: the gap ends there
        # The gap the peak is most likely in first; the other only when that one is empty.
        for lo, hi in self._gaps_by_likelihood(b, lower, upper, measured):
            pool = divisors(per_device_batch) if per_device_batch is not None else range(lo + 1, hi)
            inside = [d for d in pool if lo < d < hi and d <= max_batch and d not in probed]
            if prediction.batch is not None:
                inside = [d for d in inside if d <= prediction.batch]
            if inside:
                break
        else:
            return best
        middle = (lo * hi) ** 0.5
        c = self._at(best, min(inside, key=lambda d: abs(d - middle)), per_device_batch)
        r = self._run(c)
        return c if self._fits(r) and self._gain(c, best) > 0 else best

    @staticmethod
    def _gaps_by_likelihood(
        b: int, lower: int | None, upper: int | None, measured: Mapping[int, float]
    ) -> list[tuple[int, int]]:
        gaps = [g for g in ((b, upper), (lower, b)) if g[0] is not None and g[1] is not None]
        f_b, f_lo, f_hi = measured.get(b), measured.get(lower or -1), measured.get(upper or -1)
        if lower is not None and upper is not None and f_b and f_lo and f_hi:
            x0, x1, x2 = math.log(lower), math.log(b), math.log(upper)
            # Vertex of the parabola through the three points (Newton's divided differences).
            d1 = (f_b - f_lo) / (x1 - x0)
            d2 = (f_hi - f_b) / (x2 - x1)
            curvature = (d2 - d1) / (x2 - x0)
            if curvature < 0 and 0.5 * (x0 + x1) - d1 / (2 * curvature) < x1:
                gaps.reverse()
        return [(int(lo), int(hi)) for lo, hi in gaps if lo is not None and hi is not None]

    def _shrink(self, start: Candidate, per_device_batch: int | None) -> Candidate | None:
        """Halve (over divisors when the effective batch is kept) until a probe fits."""
        options = (
            [d for d in divisors(per_device_batch) if d < start.batch_size]
            if per_device_batch is not None
            else [b for b in (start.batch_size // 2**k for k in range(1, 32)) if b >= 1]
        )
        for batch in sorted(set(options), reverse=True):
            if len(self.trials) >= self.max_trials:
                return None
            prediction = predict_max_batch(self._points(), self.capacity, self.headroom, self._ooms())
            if prediction.batch is not None and prediction.batch > 0 and batch > prediction.batch:
                continue
            c = self._at(start, batch, per_device_batch)
            if self._fits(self._run(c)):
                return c
        return None

    def _why(self, r: ProbeResult) -> str:
        if r.oom:
            return "ran out of memory"
        if not r.ok:
            return f"failed: {r.error or 'unknown error'}"
        if r.samples_per_s is None:
            return "reported no throughput"
        if self._score(r) is None:
            return "gave no energy reading (the objective needs the GPU's energy counter)"
        return "exceeded the memory headroom"


def _plain_label(c: Candidate, group: list[Candidate]) -> str:
    """`4 × 2` as a user reads a candidate, with its precision and compile setting only where
    the candidates it is named among differ in them."""
    text = f"{c.batch_size} × {c.grad_accum_steps}"
    if len({g.precision for g in group}) > 1:
        text += f" {c.precision}"
    if len({g.compile for g in group}) > 1 and c.compile:
        text += ", compile"
    return text


def _label(c: Candidate) -> str:
    extra = f", {c.power_limit_w:.0f} W" if c.power_limit_w is not None else ""
    return f"{c.batch_size}×{c.grad_accum_steps} {c.precision}{', compile' if c.compile else ''}{extra}"
