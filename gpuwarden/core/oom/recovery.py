"""Planning the restart after an out-of-memory: classify, measure, decide, build the next spec.

This is the whole decision the daemon makes between "the attempt ran out of memory" and "start
the next attempt", kept free of the daemon so it can be tested on its own. Steps:

1. Classify — from the runner's own `oom` event when there is one (it saw the exception chain),
   else from the tail of stderr and the exit status (a `command` run: any program).
2. Measure — memory points (micro-batch, peak) from the run's progress events. When the run
   died before reporting any (the usual case: the first step did not fit), short probe processes
   give the points: one well under the OOM, then the largest micro-batch the model then says
   fits, so the answer is measured rather than extrapolated to.
3. Decide — `retune.decide` walks the run's policy ladder.
4. Apply — the knobs go back into the spec (train/infer sections, or `knobs` for command runs),
   allocator settings into `env`, and the learning rate is rescaled if the policy allowed the
   effective batch to change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.core.command.batch_hint import role_fix
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.oom.classify import Classification, classify_text
from gpuwarden.core.oom.failure_phase import evaluation_frame
from gpuwarden.core.oom.memory_model import headroom_on, predict_max_batch
from gpuwarden.core.oom.policy import resolve_policy
from gpuwarden.core.oom.retune import KIND_KNOBS, NAME_A_SETTING, RetuneDecision, decide, memory_capacity
from gpuwarden.core.oom.roles import knob_for, role_knobs

# A probe: run the job briefly at this micro-batch; the measured peak (bytes) or None, and
# whether it ran out of memory.
Probe = Callable[[int], tuple[int | None, bool]]
MAX_PROBES = 4  # tries at most, when the first ones run out of memory
WANTED_POINTS = 2  # batch sizes measured, for the memory model's line


@dataclass(frozen=True)
class ProbeTurn:
    """The probe about to run, as a person is told of it: its number, how many the retune
    expects to run now (one that runs out of memory adds another), the micro-batch, and the
    accumulation that keeps the effective batch (None where the run has none)."""

    number: int
    planned: int
    batch_size: int
    grad_accum_steps: int | None


# Told of each probe just before it runs (what the daemon records as the run's events).
OnTurn = Callable[[ProbeTurn], None]


@dataclass
class AttemptFacts:
    """What is known about the attempt that ran out of memory."""

    number: int
    events: Sequence[dict[str, Any]]  # this run's events, every attempt, oldest first
    stderr_tail: str = ""
    exit_code: int | None = None
    signal: int | None = None
    oom_kill: bool | None = None
    gpu_capacity: int | None = None  # the placed GPU's memory, when on a GPU
    host_capacity: int | None = None  # the address-space limit, else the host's memory


@dataclass
class RecoveryPlan:
    """Either a spec for the next attempt (with what changed and why) or a reason to fail."""

    classification: Classification
    decision: RetuneDecision
    spec: dict[str, Any] | None = None
    from_: dict[str, Any] = field(default_factory=dict)
    to: dict[str, Any] = field(default_factory=dict)
    probes: list[dict[str, Any]] = field(default_factory=list)
    decided: str = ""

    @property
    def give_up(self) -> str | None:
        return self.decision.give_up

    def evidence(self) -> dict[str, Any]:
        return {
            "message": self.classification.message,
            "reason": self.classification.reason,
            "fields": self.classification.fields,
            "decision": self.decision.to_dict(),
            "probes": self.probes,
            "decided": self.decided,
        }


def classification_of(facts: AttemptFacts, memory_limit: int | None = None) -> Classification:
    """The runner's `oom` event of this attempt if any, else the text and exit status
    (`memory_limit`: the run's address-space limit, if it has one); an out-of-memory whose
    traceback passes through evaluation says so (`phase`, and the `frame` that evaluates)."""
    found = _classified(facts, memory_limit)
    frame = evaluation_frame(facts.stderr_tail) if found.is_oom else None
    if frame is None:
        return found
    return replace(found, fields={**found.fields, "phase": "evaluation", "frame": frame})


def _classified(facts: AttemptFacts, memory_limit: int | None) -> Classification:
    for e in reversed(facts.events):
        if e.get("attempt") == facts.number and e.get("type") == "oom":
            fields = e.get("fields") if isinstance(e.get("fields"), dict) else {}
            verdict = str(e.get("verdict") or "gpu_capacity")
            message = str(e.get("message") or "")
            text = classify_text(message, exit_code=facts.exit_code, memory_limit=memory_limit)
            # The runner saw the exception chain: its verdict stands; the text adds the reason.
            if text.verdict == verdict:
                return text
            return Classification(verdict, message, fields, text.reason or verdict)  # type: ignore[arg-type]
    return classify_text(
        facts.stderr_tail,
        exit_code=facts.exit_code,
        signal=facts.signal,
        oom_kill=facts.oom_kill,
        memory_limit=memory_limit,
    )


def current_knobs(spec: RunSpec) -> dict[str, Any]:
    if spec.train is not None:
        t = spec.train
        knobs = {k: getattr(t, k) for k in sorted(KIND_KNOBS["train"])}
        knobs["precision"] = t.resolved_precision_request()
        return knobs
    if spec.infer is not None:
        return {k: getattr(spec.infer, k) for k in sorted(KIND_KNOBS["infer"])}
    return role_knobs(spec)


def _spec_hints(spec: RunSpec) -> dict[str, Any]:
    """Facts of the spec that rungs read beside its knobs."""
    if spec.command is not None and not isinstance(spec.command.roles.world_size, str):
        return {"fixed_world_size": True}  # a number in the spec, or none: no knob to change
    return {}


def memory_points(events: Sequence[dict[str, Any]], host: bool) -> list[tuple[int, int]]:
    """(micro-batch, peak) from progress events. For host OOM under an address-space limit the
    runner's `vm_peak` (address space) is what the limit counts, so it is preferred there."""
    points: list[tuple[int, int]] = []
    for e in events:
        if e.get("type") != "progress" or not isinstance(e.get("batch_size"), int):
            continue
        peak = e.get("vm_peak") if host and isinstance(e.get("vm_peak"), int) else e.get("mem_peak")
        if isinstance(peak, int | float) and peak > 0:
            points.append((int(e["batch_size"]), int(peak)))
    return points


def fixed_memory(events: Sequence[dict[str, Any]], attempt: int, host: bool) -> int | None:
    """What the attempt's processes said they hold whatever the micro-batch (`fixed_memory`
    events) in the memory that ran out: the address space for a host OOM, else the GPU's. The
    least of the ranks' figures, as each holds its own copy; only this attempt's, since the
    next may hold less (16-bit weights, offload)."""
    device = "cpu" if host else "cuda"
    figures = [
        e["fixed_bytes"]
        for e in events
        if e.get("type") == "fixed_memory"
        and e.get("attempt") == attempt
        and e.get("device") == device
        and isinstance(e.get("fixed_bytes"), int)
        and not isinstance(e.get("fixed_bytes"), bool)
        and e["fixed_bytes"] > 0
    ]
    return min(figures, default=None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# The largest micro-batch the memory model says fits, given (batch, peak) points and the
# micro-batches that ran out of memory; None where it cannot say.
Fits = Callable[[list[tuple[int, int]], list[int]], "int | None"]


@dataclass
class _Probing:
    """What the probes of one retune have found so far."""

    options: list[int]  # micro-batches a probe may take, ascending
    ooms: list[int]
    points: list[tuple[int, int]] = field(default_factory=list)
    tried: set[int] = field(default_factory=set)
    log: list[dict[str, Any]] = field(default_factory=list)

    def untried(self) -> list[int]:
        return [d for d in self.options if d not in self.tried and d < min(self.ooms)]

    def low(self) -> int | None:
        """Well under the smallest OOM (1/8 of it, 1/4 after a probe's own OOM): a first point
        that is sure to run."""
        untried = self.untried()
        if not untried:
            return None
        below = [d for d in untried if d <= max(1, min(self.ooms) // (8 if len(self.ooms) == 1 else 4))]
        return max(below) if below else min(untried)


def _next_probe(state: _Probing, fits: Fits) -> int | None:
    """The micro-batch to probe next, or None when the model's answer is measured.

    After a first point well under the OOM, the next probe goes to the largest micro-batch the
    model says fits (the line through that point and the OOM over-estimates it): the answer is
    then measured, not extrapolated to, and one that runs out of memory moves the bound down."""
    if not state.points:
        return state.low()
    predicted = fits(state.points, state.ooms)
    if predicted is None:
        return state.low() if len(state.points) < WANTED_POINTS else None
    best = max((d for d in state.options if d <= predicted and d < min(state.ooms)), default=None)
    if best is None:
        return None
    if best not in state.tried:
        return best
    if len({b for b, _ in state.points}) >= WANTED_POINTS:
        return None
    below = [d for d in state.untried() if d < best]
    return max(below) if below else None


def _probe_points(
    probe: Probe,
    batch: int,
    per_device: int | None,
    min_batch: int,
    fits: Fits,
    on_turn: OnTurn | None = None,
) -> _Probing:
    """Probe the micro-batches that keep the effective batch (its divisors) until the largest
    that fits is measured, with two batch sizes for the memory model's line."""
    options = [
        d for d in (_divisors(per_device) if per_device else range(1, batch)) if min_batch <= d < batch
    ]
    state = _Probing(options, [batch])
    for _ in range(MAX_PROBES):
        b = _next_probe(state, fits)
        if b is None:
            break
        if on_turn is not None:
            on_turn(_turn(len(state.tried) + 1, len(state.points), len(state.untried()), b, per_device))
        state.tried.add(b)
        peak, oom = probe(b)
        state.log.append({"batch_size": b, "peak": peak, "oom": oom})
        if oom:
            state.ooms.append(b)
        elif peak is not None:
            state.points.append((b, peak))
    return state


def _turn(number: int, measured: int, untried: int, batch: int, per_device: int | None) -> ProbeTurn:
    """Probe `number`, with `measured` batch sizes so far and `untried` left to try: as many
    more as the memory model still needs, within the tries and the batch sizes there are."""
    more = min(WANTED_POINTS - measured, MAX_PROBES - number + 1, untried)
    accum = max(1, per_device // batch) if per_device else None
    return ProbeTurn(number, number - 1 + max(1, more), batch, accum)


def plan_recovery(
    spec: RunSpec,
    facts: AttemptFacts,
    *,
    history: list[dict[str, Any]],
    retunes_so_far: int,
    elapsed_s: float,
    probe: Probe | None = None,
    hints: Mapping[str, Any] | None = None,
    on_turn: OnTurn | None = None,
    remembered: Sequence[tuple[int, int]] = (),
    probe_processes: Callable[[], int] | None = None,
    restart_measures: bool = False,
) -> RecoveryPlan:
    """Everything between "this attempt ran out of memory" and the next attempt's spec.

    `hints` are facts of the machine now that rungs read (`other_gpus`, `usable_gpus`);
    `on_turn` hears of each probe before it runs; `remembered` are (micro-batch, peak) points an
    earlier run of the same shape measured under the same memory; `probe_processes` says how many
    processes `probe` started (one per size when not given); `restart_measures` says that no probe
    runs because the restart itself measures its size (a user's own program)."""
    classification = classification_of(facts, spec.resources.memory_limit)
    policy = resolve_policy(spec.policy, kind=spec.kind)
    knobs = {**current_knobs(spec), **_spec_hints(spec), **(hints or {})}
    host = classification.verdict == "host_oom"
    capacity = facts.host_capacity if host else facts.gpu_capacity
    probing = _Probes(probe, on_turn, probe_processes, restart_measures)
    fixed = _weighed_fixed_memory(spec, facts, host)
    measured = _measure(spec, facts, classification, knobs, capacity, probing, remembered, fixed)
    points, ooms = measured.points, measured.ooms
    batch = knobs.get("batch_size")
    decision = decide(
        classification,
        policy,
        kind=spec.kind,
        knobs=knobs,
        history=history,
        memory_points=points,
        capacity=capacity,
        attempts_so_far=retunes_so_far,
        elapsed_s=elapsed_s,
        env={**(spec.command.env if spec.command is not None else {}), **spec.env},
        ooms=ooms,
        fixed_at_least=fixed,
    )
    plan = RecoveryPlan(classification, decision, probes=measured.probes, decided=measured.decided)
    if decision.is_give_up:
        return replace(plan, decision=_named_fix(spec, decision))
    if decision.prediction is None and points and capacity and isinstance(batch, int):
        decision_prediction = predict_max_batch(
            points,
            capacity,
            policy.headroom,
            oom_at=[batch],
            headroom_on=headroom_on(classification.verdict),
            fixed_at_least=fixed,
        ).to_dict()
        plan.decision = replace(decision, prediction=decision_prediction)
    plan.spec, plan.from_, plan.to = apply_decision(spec, plan.decision)
    return plan


def _named_fix(spec: RunSpec, decision: RetuneDecision) -> RetuneDecision:
    """A script run as it is: its give-up names the flag of its own command that reads as the
    batch size, not an example's."""
    fix = role_fix(spec)
    if fix is None or decision.give_up is None or NAME_A_SETTING not in decision.give_up:
        return decision
    concrete = f"a retune may change — {fix}"
    return replace(decision, give_up=decision.give_up.replace(NAME_A_SETTING, concrete))


def _weighed_fixed_memory(spec: RunSpec, facts: AttemptFacts, host: bool) -> int | None:
    """The attempt's fixed memory where it can be weighed against the memory that ran out. On
    the host the figure is address space: what an address-space limit counts, but no bound on the
    resident memory a host without one runs out of."""
    if host and not spec.resources.memory_limit:
        return None
    return fixed_memory(facts.events, facts.number, host)


@dataclass(frozen=True)
class _Measured:
    """The memory points a decision stands on, the probes that gave some of them, the micro-batches
    that ran out in a probe, and which way it was decided, as the evidence says it."""

    points: list[tuple[int, int]]
    probes: list[dict[str, Any]]
    ooms: tuple[int, ...]
    decided: str


@dataclass(frozen=True)
class _Probes:
    """How a retune may measure: the probe, who hears of each turn, how many processes it took."""

    probe: Probe | None
    on_turn: OnTurn | None
    processes: Callable[[], int] | None
    restart_measures: bool = False

    def count(self, sizes: int) -> int:
        return self.processes() if self.processes is not None else sizes


def _measure(
    spec: RunSpec,
    facts: AttemptFacts,
    classification: Classification,
    knobs: dict[str, Any],
    capacity: int | None,
    probing: _Probes,
    remembered: Sequence[tuple[int, int]],
    fixed: int | None,
) -> _Measured:
    """What is already known (the run's own steps, every attempt's; an earlier run of the same
    shape; the memory it holds whatever the batch), and probes only where that leaves the fit open."""
    host = classification.verdict == "host_oom"
    steps = memory_points(facts.events, host)
    points = steps + [p for p in remembered if p[0] > 0 and p[1] > 0]
    batch = knobs.get("batch_size")
    limit = memory_capacity(classification, capacity)
    if fixed is not None and limit and fixed >= limit:
        return _Measured(points, [], (), "decided from the fixed memory the run reported, no probe")
    probe = probing.probe
    if probe is None or not isinstance(batch, int) or not _worth_probing(classification, batch, points):
        decided = decided_text(len(steps), len(points) - len(steps), 0)
        if (
            probing.restart_measures
            and isinstance(batch, int)
            and _worth_probing(classification, batch, points)
        ):
            decided += ": the restart measures its size itself"  # a probe would be a start of the program too
        return _Measured(points, [], (), decided)
    policy = resolve_policy(spec.policy, kind=spec.kind)
    on = headroom_on(classification.verdict)

    def fits(measured: list[tuple[int, int]], failed: list[int]) -> int | None:
        return predict_max_batch(points + measured, limit, policy.headroom, failed, on, fixed).batch

    per_device = _per_device_batch(spec, knobs, batch)
    found = _probe_points(probe, batch, per_device, policy.min_micro_batch, fits, probing.on_turn)
    sizes = len(found.log)
    decided = decided_text(len(steps), len(points) - len(steps), sizes, probing.count(sizes))
    return _Measured(points + found.points, found.log, tuple(found.ooms[1:]), decided)


def decided_text(steps: int, remembered: int, probes: int, processes: int | None = None) -> str:
    """`decided from 2 measured steps, no probe` / `1 probe process, 3 sizes` (`probes` sizes
    measured in `processes` processes, one per size when not given)."""
    if probes:
        started = probes if processes is None else processes
        return f"{_count(started, 'probe process', 'es')}, {_count(probes, 'size')}"
    known = [
        *([_count(steps, "measured step")] if steps else []),
        *([_count(remembered, "size") + " remembered from a run of the same shape"] if remembered else []),
    ]
    if not known:
        return "decided without memory figures, no probe"
    return f"decided from {' and '.join(known)}, no probe"


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{plural}"


def _gpus_follow_world(
    doc: dict[str, Any], world: int, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """One GPU per rank: a gang on GPUs asks for as many as it has ranks (placement picks them by
    free memory, so GPUs named in a list give way to a count). CPU ranks (`gpus: 0`) stay there."""
    resources = doc.setdefault("resources", {})
    old = resources.get("gpus", 1)
    if old == 0 or old == world:
        return
    resources["gpus"] = world
    before["resources.gpus"], after["resources.gpus"] = old, world


def _worth_probing(classification: Classification, batch: int, points: list[tuple[int, int]]) -> bool:
    """Probes help a retune that shrinks the batch for lack of memory (not fragmentation or
    contention), when the batch can shrink and fewer than two batch sizes were measured."""
    return (
        classification.retunable
        and classification.verdict in ("gpu_capacity", "host_oom")
        and batch > 1
        and len({b for b, _ in points}) < 2
    )


def _per_device_batch(spec: RunSpec, knobs: dict[str, Any], batch: int) -> int | None:
    """Micro-batch × accumulation, whose divisors keep the effective batch; None without accumulation."""
    if spec.train is not None:
        return spec.train.batch_size * spec.train.grad_accum_steps
    accum = knobs.get("grad_accum_steps")
    return batch * int(accum) if isinstance(accum, int) else None


def apply_decision(
    spec: RunSpec, decision: RetuneDecision
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The next attempt's spec document, and the (from, to) of everything that changed."""
    doc = spec.model_dump(mode="json", exclude_none=True)
    section = "train" if spec.train is not None else "infer" if spec.infer is not None else None
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for knob, (old, new) in decision.changes.items():
        if section is not None:
            doc[section][knob] = new
            key = f"{section}.{knob}"
        else:
            name = knob_for(spec, knob)  # a command run's own knob that plays this role
            doc.setdefault("knobs", {})[name] = new
            key = f"knobs.{name}"
        before[key], after[key] = old, new
    if section == "train" and "precision" in decision.changes:
        doc["train"].pop("amp", None)
    if "world_size" in decision.changes:
        _gpus_follow_world(doc, decision.changes["world_size"][1], before, after)
    for name, value in decision.env.items():
        old_env = doc.get("env", {}).get(name)
        if old_env != value:
            doc.setdefault("env", {})[name] = value
            before[f"env.{name}"], after[f"env.{name}"] = old_env, value
    if decision.lr_scale is not None and section == "train":
        opt = doc["train"].setdefault("optimizer", {})
        old_lr = spec.train.optimizer.lr if spec.train is not None else None
        if old_lr is not None:
            opt["lr"] = old_lr * decision.lr_scale
            before["train.optimizer.lr"], after["train.optimizer.lr"] = old_lr, opt["lr"]
    return doc, before, after
