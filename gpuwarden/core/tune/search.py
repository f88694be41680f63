"""The search itself, pure: it decides what to probe next; an injected function runs the probe.

Rules learned from the failures of other batch-size finders:
- throughput (samples/s) is the objective, not utilisation;
- a candidate counts only with its peak memory under capacity × (1 − headroom): Lightning's
  finder picked sizes that fit a 3-step probe and ran out of memory later;
- the micro-batch grows geometrically (×3, then one probe in each gap next to the best), and the
  memory model (fitted on the probes so far) skips
  candidates it predicts would not fit, so no probe is wasted on a certain OOM;
- the search stops when steps up gain less than `min_gain` (DeepSpeed's autotuner: < 5 %) —
  two in a row, since one noisy reading is not evidence;
- with the effective batch kept, candidates are the divisors of the per-device batch, so that
  micro-batch × accumulation stays exactly equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpuwarden.core.oom.memory_model import DEFAULT_HEADROOM, predict_max_batch


@dataclass(frozen=True)
class Candidate:
    """One configuration to probe."""

    batch_size: int
    grad_accum_steps: int
    precision: str
    compile: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProbeResult:
    """What one probe process measured (after its warm-up steps)."""

    candidate: Candidate
    ok: bool
    oom: bool = False
    samples_per_s: float | None = None
    mem_peak: int | None = None
    wall_s: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "candidate": self.candidate.to_dict()}


ProbeFn = Callable[[Candidate], ProbeResult]


@dataclass
class TuneResult:
    best: ProbeResult | None
    trials: list[ProbeResult] = field(default_factory=list)
    stopped_because: str = ""
    capacity: int | None = None
    headroom: float = DEFAULT_HEADROOM

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
        patience: int = 1,
    ) -> None:
        self._probe = probe
        self.factor = factor
        self.patience = patience
        self.capacity = capacity
        self.headroom = headroom
        self.min_gain = min_gain
        self.max_trials = max_trials
        self.trials: list[ProbeResult] = []

    def _run(self, c: Candidate) -> ProbeResult:
        r = self._probe(c)
        self.trials.append(r)
        return r

    def _fits(self, r: ProbeResult) -> bool:
        if not r.ok or r.samples_per_s is None:
            return False
        if self.capacity is None or r.mem_peak is None:
            return True
        return r.mem_peak <= self.capacity * (1.0 - self.headroom)

    def _points(self) -> list[tuple[int, int]]:
        return [(t.candidate.batch_size, t.mem_peak) for t in self.trials if t.ok and t.mem_peak is not None]

    def _ooms(self) -> list[int]:
        return [t.candidate.batch_size for t in self.trials if t.oom]

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
        the other precisions and compile settings at the best micro-batch."""
        best, why = self._search_batch(start, per_device_batch, max_batch)
        if best is not None:
            best = self._refine(best, start, per_device_batch, max_batch)
            for precision in precisions or []:
                if len(self.trials) >= self.max_trials or precision == best.candidate.precision:
                    continue
                r = self._run(replace(best.candidate, precision=precision))
                if self._fits(r) and _gain(r, best) >= self.min_gain:
                    best = r
            for comp in compile_options or []:
                if len(self.trials) >= self.max_trials or comp == best.candidate.compile:
                    continue
                r = self._run(replace(best.candidate, compile=comp))
                if self._fits(r) and _gain(r, best) >= self.min_gain:
                    best = r
        return TuneResult(best, list(self.trials), why, self.capacity, self.headroom)

    def _accum_for(self, start: Candidate, batch: int, per_device_batch: int | None) -> int:
        if per_device_batch is None:
            return start.grad_accum_steps
        return per_device_batch // batch

    def _search_batch(
        self, start: Candidate, per_device_batch: int | None, max_batch: int
    ) -> tuple[ProbeResult | None, str]:
        first = self._run(start)
        if not self._fits(first):
            best = self._shrink(start, per_device_batch)
            if best is None:
                return None, f"even the smallest micro-batch did not fit or failed ({_why(self.trials[-1])})"
            return best, "the starting micro-batch did not fit; this is the largest that did"
        best = first
        misses = 0
        for batch in batch_ladder(start.batch_size, per_device_batch, max_batch, self.factor):
            if len(self.trials) >= self.max_trials:
                return best, f"reached the trial limit ({self.max_trials})"
            prediction = predict_max_batch(self._points(), self.capacity, self.headroom, self._ooms())
            if prediction.batch is not None and batch > prediction.batch:
                return best, (
                    f"micro-batch {batch} is predicted not to fit (largest predicted: {prediction.batch}, "
                    f"{prediction.basis})"
                )
            r = self._run(
                replace(
                    start, batch_size=batch, grad_accum_steps=self._accum_for(start, batch, per_device_batch)
                )
            )
            if not self._fits(r):
                return best, f"micro-batch {batch} {_why(r)}"
            gain = _gain(r, best)
            if gain < self.min_gain:
                # One short reading must not end the search (timings are noisy): stop after
                # `patience` rungs in a row gain too little. Ties keep the smaller micro-batch,
                # which runs as fast with more memory headroom.
                misses += 1
                if misses > self.patience:
                    return (
                        best,
                        f"micro-batch {batch} gained {100 * gain:.1f} % (< {100 * self.min_gain:.0f} %)",
                    )
                continue
            best, misses = r, 0
        return best, "no larger micro-batch to try"

    def _refine(
        self, best: ProbeResult, start: Candidate, per_device_batch: int | None, max_batch: int
    ) -> ProbeResult:
        """One more probe where the peak most likely is: the coarse ladder can step over it (16 →
        48 → 144 when 24 is fastest). A parabola in log(micro-batch) through the best rung and its
        neighbours says on which side; with one neighbour only, that side's gap is probed."""
        if len(self.trials) >= self.max_trials:
            return best
        measured = {
            t.candidate.batch_size: t.samples_per_s
            for t in self.trials
            if t.candidate.precision == start.precision and self._fits(t) and t.samples_per_s
        }
        probed = {t.candidate.batch_size for t in self.trials if t.candidate.precision == start.precision}
        b = best.candidate.batch_size
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
        batch = min(inside, key=lambda d: abs(d - middle))
        accum = self._accum_for(start, batch, per_device_batch)
        r = self._run(replace(best.candidate, batch_size=batch, grad_accum_steps=accum))
        return r if self._fits(r) and _gain(r, best) > 0 else best

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

    def _shrink(self, start: Candidate, per_device_batch: int | None) -> ProbeResult | None:
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
            r = self._run(
                replace(
                    start, batch_size=batch, grad_accum_steps=self._accum_for(start, batch, per_device_batch)
                )
            )
            if self._fits(r):
                return r
        return None


def _gain(new: ProbeResult, old: ProbeResult) -> float:
    if new.samples_per_s is None or old.samples_per_s is None or old.samples_per_s <= 0:
        return 0.0
    return new.samples_per_s / old.samples_per_s - 1.0


def _why(r: ProbeResult) -> str:
    if r.oom:
        return "ran out of memory"
    if not r.ok:
        return f"failed: {r.error or 'unknown error'}"
    if r.samples_per_s is None:
        return "reported no throughput"
    return "exceeded the memory headroom"
