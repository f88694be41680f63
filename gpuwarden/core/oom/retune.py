"""The retune decision: given a classified failure and a policy, the one change for the restart.

Pure and deterministic: the daemon passes everything (current knobs, history, measured peaks,
capacity, attempts, time, environment) and records what comes back. The ladder is walked from
the top; a rung is skipped when it does not answer the verdict, is already in effect, or does
not exist for the run's kind, and every skip is remembered so a give-up says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.core.oom.classify import Classification, format_size, parse_size
from gpuwarden.core.oom.memory_model import Prediction, headroom_on, predict_max_batch
from gpuwarden.core.oom.policy import DEFAULT_MAX_TIMES, RetunePolicy, Rung
from gpuwarden.core.units import size

ALLOC_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"
DEFAULT_FACTOR = 0.5
DEFAULT_WAIT_SECONDS = 60.0
DEFAULT_GPU_FRACTION = 0.85
DEFAULT_OFFLOAD_FACTOR = 0.8
# Lowering the micro-batch is given up when this many sizes in a row (the two last lowered) each
# failed allocating the same bytes, at least this share of the memory that ran out.
SAME_REQUEST_RUNS = 3
SAME_REQUEST_SHARE = 0.01
# Below this a GPU budget leaves no room for anything but the CUDA context.
MIN_GPU_BUDGET = 1 << 30

RUN_KINDS = ("train", "infer", "command")
# Knobs each built-in kind has; a `command` run has the knobs its spec declares.
KIND_KNOBS: dict[str, frozenset[str]] = {
    "train": frozenset(
        {"batch_size", "grad_accum_steps", "world_size", "max_length", "gradient_checkpointing", "precision"}
    ),
    "infer": frozenset(
        {
            "batch_size",
            "max_new_tokens",
            "max_pixels",
            "precision",
            "max_memory",
            "device_map",
            "load_in_8bit",
        }
    ),
}
# What a rung can change in a command run, beside a world size the spec may fix as a number.
RETUNABLE = (KIND_KNOBS["train"] | KIND_KNOBS["infer"] | {"eval_batch_size"}) - {"world_size", "device_map"}

# A script run as it is: the one step that makes it retunable.
NAME_A_SETTING = (
    "a retune may change — name the flag that sets the micro-batch, and the accumulation's where "
    "there is one (gpuwarden run --role micro_batch=batch-size --role accum_steps=grad-accum -- … "
    "--batch-size 32 --grad-accum 1; an override such as training.batch_size=32 the same way: "
    "--role micro_batch=training.batch_size), or command.roles in a spec"
)


@dataclass(frozen=True)
class RetuneDecision:
    """What the next restart changes, or why the run must fail.

    `changes` maps each knob to (from, to); `env` holds variables to set for the restart;
    `lr_scale` is set only when the effective batch changed (linear scaling rule, new/old);
    `wait_s` asks the daemon to wait before restarting; `give_up` is a one-line reason to fail.
    """

    action: str
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    lr_scale: float | None = None
    reason: str = ""
    prediction: dict[str, Any] | None = None
    give_up: str | None = None
    wait_s: float | None = None
    rung: int | None = None
    # The allocation that failed (bytes), kept so a later decision can tell whether lowering the
    # micro-batch changed it.
    request: int | None = None

    @property
    def is_give_up(self) -> bool:
        """The run must fail; nothing is restarted."""
        return self.give_up is not None

    def apply(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The knobs for the restart: `knobs` with this decision's changes applied."""
        out = dict(knobs)
        for name, (_, new) in self.changes.items():
            out[name] = new
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; (from, to) pairs become two-element lists."""
        return {
            "action": self.action,
            "changes": {k: [a, b] for k, (a, b) in self.changes.items()},
            "env": dict(self.env),
            "lr_scale": self.lr_scale,
            "reason": self.reason,
            "prediction": self.prediction,
            "give_up": self.give_up,
            "wait_s": self.wait_s,
            "rung": self.rung,
            "request": self.request,
        }


def memory_capacity(classification: Classification, capacity: int | None) -> int | None:
    """The memory that ran out: the card's (or the allocator's cap), or the host limit given."""
    if classification.verdict == "host_oom":
        return capacity
    candidates = [capacity]
    for name in ("allowed", "total"):
        value = classification.fields.get(name)
        if isinstance(value, int):
            candidates.append(value)
            break
    known = [c for c in candidates if c is not None and c > 0]
    return min(known) if known else None


def _give_up(reason: str, prediction: dict[str, Any] | None = None) -> RetuneDecision:
    return RetuneDecision(action="give_up", reason=reason, give_up=reason, prediction=prediction)


@dataclass
class _Context:
    classification: Classification
    policy: RetunePolicy
    kind: str
    knobs: dict[str, Any]
    history: list[dict[str, Any]]
    memory_points: list[tuple[int, int]]
    capacity: int | None
    env: dict[str, str]
    ooms: tuple[int, ...] = ()
    fixed_at_least: int | None = None
    prediction: Prediction | None = None
    unshrinking: str | None = None  # why lowering the micro-batch again would fail the same way

    def has(self, knob: str) -> bool:
        """Whether the run has this knob: built-in kinds by their spec, command runs by `knobs`."""
        if self.kind in KIND_KNOBS:
            return knob in KIND_KNOBS[self.kind]
        return knob in self.knobs

    def times_used(self, action: str) -> int:
        return sum(1 for h in self.history if h.get("action") == action)

    def memory_capacity(self) -> int | None:
        """The memory that ran out: the card's (or the allocator's cap), or the host limit given."""
        return memory_capacity(self.classification, self.capacity)

    def predict(self, batch: int) -> Prediction:
        """Largest batch the memory model expects to fit; the current batch just ran out."""
        if self.prediction is None:
            self.prediction = predict_max_batch(
                self.memory_points,
                self.memory_capacity(),
                self.policy.headroom,
                oom_at=[batch, *self.ooms],
                headroom_on=headroom_on(self.classification.verdict),
                fixed_at_least=self.fixed_at_least,
            )
        return self.prediction

    def fixed_exceeds(self) -> str | None:
        """`the weights, gradients and optimizer state alone take at least 2.1 GiB of the 1.6 GiB
        that ran out`, when they do: no rung that lowers only what grows with the batch helps."""
        capacity = self.memory_capacity()
        if self.fixed_at_least is None or not capacity or self.fixed_at_least < capacity:
            return None
        return (
            f"the weights, gradients and optimizer state alone take at least {size(self.fixed_at_least)} "
            f"of the {size(capacity)} that ran out"
        )


# A rung handler returns the decision, or a short note saying why the rung does not apply.
_Handler = Callable[[_Context, Rung], "RetuneDecision | str"]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _int_knob(ctx: _Context, name: str, default: int) -> int:
    value = ctx.knobs.get(name, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _allocator(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    device = ctx.classification.fields.get("device")
    if device in ("mps", "xpu", "cpu"):
        return f"the allocator setting is for CUDA and ROCm, not {device}"
    for name in ALLOC_VARIABLES:
        value = ctx.env.get(name, "").replace(" ", "").lower()
        if "expandable_segments:true" in value:
            return f"{name} already has expandable_segments:True"
        if "expandable_segments:false" in value:
            return f"{name} sets expandable_segments:False; left as the run's environment chose"
    target: str = rung.variable or next((n for n in ALLOC_VARIABLES if ctx.env.get(n)), ALLOC_VARIABLES[0])
    old = ctx.env.get(target, "")
    new = f"{old},{EXPANDABLE}" if old else EXPANDABLE
    return RetuneDecision(
        action=rung.action,
        env={target: new},
        reason=f"{ctx.classification.reason}; set {target}={new} so freed blocks can be reused",
    )


def _micro_batch(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    if ctx.kind == "infer":
        return "inference has no micro-batch (reduce_generation_batch lowers its batch)"
    if not ctx.has("batch_size"):
        return "the run has no batch_size knob"
    if ctx.kind == "command" and not ctx.has("grad_accum_steps"):
        return "the run has no grad_accum_steps knob, so the effective batch cannot be kept"
    micro = _int_knob(ctx, "batch_size", 1)
    accum = _int_knob(ctx, "grad_accum_steps", 1)
    world = _int_knob(ctx, "world_size", 1)
    ctx.unshrinking = _request_unchanged(ctx, micro)
    if ctx.unshrinking is not None:
        return ctx.unshrinking
    floor = ctx.policy.min_micro_batch
    per_device = micro * accum
    candidates = [d for d in _divisors(per_device) if floor <= d < micro]
    if not candidates:
        if micro <= floor:
            return f"micro-batch {micro} is the minimum (min_micro_batch {floor})"
        return f"no divisor of {per_device} (micro × accumulation) between {floor} and {micro}"
    prediction = ctx.predict(micro)
    limit = prediction.batch if prediction.batch is not None else micro // 2
    fitting = [d for d in candidates if d <= limit]
    # When the model says nothing fits, the smallest allowed micro-batch is the best left to try.
    new = max(fitting) if fitting else min(candidates)
    new_accum = per_device // new
    why = (
        f"memory model predicts {prediction.batch} fits ({prediction.basis})"
        if prediction.batch is not None
        else f"no prediction ({prediction.basis}); halving"
    )
    requested = ctx.classification.fields.get("requested")
    return RetuneDecision(
        action=rung.action,
        request=requested if isinstance(requested, int) else None,
        changes={"batch_size": (micro, new), "grad_accum_steps": (accum, new_accum)},
        reason=(
            f"{ctx.classification.reason}; {why}: micro-batch {micro} → {new}, accumulation "
            f"{accum} → {new_accum}, effective batch {per_device * world} kept{_evaluation_note(ctx)}"
        ),
        prediction=prediction.to_dict(),
    )


def _evaluation_note(ctx: _Context) -> str:
    """Where the failure was in evaluation and the run names no evaluation batch: the micro-batch
    sizes evaluation only where evaluation uses it (Lightning's one data-module batch size)."""
    if ctx.classification.fields.get("phase") != "evaluation" or ctx.has("eval_batch_size"):
        return ""
    return (
        f" (it ran out in evaluation ({ctx.classification.fields.get('frame')}); where evaluation has a "
        "batch of its own, such as the Trainer's --per_device_eval_batch_size, pass it on the command and "
        "name it with --role eval_batch=… so a retune lowers that instead)"
    )


def _request_unchanged(ctx: _Context, micro: int) -> str | None:
    """Why lowering the micro-batch again would fail the same way: the last two lowerings each
    ended in the same failed allocation, a share of the memory no stray block reaches (an
    allocator's 2 MiB block fails whatever was asked, so small requests prove nothing). What
    does not shrink with the micro-batch is held whatever it is: weights, optimizer state,
    a buffer of the program's, data it loads whole."""
    requested = ctx.classification.fields.get("requested")
    capacity = ctx.memory_capacity()
    if not isinstance(requested, int) or not capacity or requested < capacity * SAME_REQUEST_SHARE:
        return None
    sizes = [micro]
    for earlier in reversed(ctx.history):
        pair = (earlier.get("changes") or {}).get("batch_size")
        if earlier.get("action") != "reduce_micro_batch" or earlier.get("request") != requested:
            break
        if not isinstance(pair, list | tuple) or len(pair) != 2 or pair[1] != sizes[-1]:
            break
        sizes.append(pair[0])
        if len(sizes) == SAME_REQUEST_RUNS:
            tried = ", ".join(str(b) for b in reversed(sizes[1:])) + f" and {micro}"
            return (
                f"micro-batch {tried} each failed allocating the same {size(requested)}: that memory "
                "does not shrink with the micro-batch (weights, optimizer state, or data or a buffer "
                "the program holds whole)"
            )
    return None


def _flag(knob: str, label: str) -> _Handler:
    def handler(ctx: _Context, rung: Rung) -> RetuneDecision | str:
        if not ctx.has(knob):
            return f"the run has no {knob} knob"
        if bool(ctx.knobs.get(knob)):
            return f"{label} is already on"
        if knob == "load_in_8bit":
            device = ctx.classification.fields.get("device", ctx.knobs.get("device"))
            if device not in (None, "cuda"):
                return f"8-bit weights need CUDA, the run is on {device}"
        return RetuneDecision(
            action=rung.action,
            changes={knob: (ctx.knobs.get(knob, False), True)},
            reason=f"{ctx.classification.reason}; turn on {label}",
        )

    return handler


_SIXTEEN_BIT = ("bf16", "fp16")


def _precision(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    if not ctx.has("precision"):
        return "the run has no precision knob"
    current = str(ctx.knobs.get("precision", "auto"))
    resolved = str(ctx.knobs.get("resolved_precision", current))
    if current in _SIXTEEN_BIT or resolved in _SIXTEEN_BIT:
        return f"precision is already {resolved if resolved in _SIXTEEN_BIT else current}"
    bf16_ok = ctx.knobs.get("bf16_supported") is not False
    target = rung.precision or ("bf16" if bf16_ok else "fp16")
    if target == "bf16" and not bf16_ok:
        return "bf16 is not supported on this device"
    return RetuneDecision(
        action=rung.action,
        changes={"precision": (current, target)},
        reason=f"{ctx.classification.reason}; precision {current} → {target}",
    )


def _semantic(knob: str) -> _Handler:
    def handler(ctx: _Context, rung: Rung) -> RetuneDecision | str:
        if not ctx.has(knob):
            return f"the run has no {knob} knob"
        if not ctx.policy.allows(knob):
            return f"{knob} changes results and the policy does not allow it (add {knob} to `allow`)"
        current = ctx.knobs.get(knob)
        if not isinstance(current, int) or isinstance(current, bool):
            return f"{knob} is not set (the model's default); set it in the spec to let the ladder lower it"
        new = math.floor(current * (rung.factor or DEFAULT_FACTOR))
        if rung.multiple_of:
            new -= new % rung.multiple_of
        new = max(new, rung.min or 1)
        if new >= current:
            return f"{knob} {current} is at its minimum ({rung.min or 1})"
        return RetuneDecision(
            action=rung.action,
            changes={knob: (current, new)},
            reason=f"{ctx.classification.reason}; {knob} {current} → {new} (allowed by the policy)",
        )

    return handler


def _generation_batch(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    if not ctx.has("batch_size"):
        return "the run has no batch_size knob"
    if ctx.kind == "train" or (ctx.kind == "command" and ctx.has("grad_accum_steps")):
        return "a training batch is changed by reduce_micro_batch, which keeps the effective batch"
    batch = _int_knob(ctx, "batch_size", 1)
    floor = rung.min or 1
    if batch <= floor:
        return f"generation batch {batch} is the minimum ({floor})"
    prediction = ctx.predict(batch)
    if prediction.batch is not None:
        target = prediction.batch
        why = f"memory model predicts {prediction.batch} fits ({prediction.basis})"
    else:
        target = math.floor(batch * (rung.factor or DEFAULT_FACTOR))
        why = f"no prediction ({prediction.basis}); ×{rung.factor or DEFAULT_FACTOR}"
    new = max(floor, min(target, batch - 1))
    # A user's program with a batch and no accumulation may be inference, or training that keeps
    # its effective batch itself (LitGPT's global_batch_size) or does not: said, not presumed.
    what = (
        f"batch {batch} → {new} (no accumulation is named: a training run's effective batch changes "
        "with it, unless the program keeps it itself)"
        if ctx.kind == "command"
        else f"generation batch {batch} → {new}"
    )
    return RetuneDecision(
        action=rung.action,
        changes={"batch_size": (batch, new)},
        reason=f"{ctx.classification.reason}; {why}: {what}",
        prediction=prediction.to_dict(),
    )


def _eval_batch(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    """An out-of-memory in evaluation: the evaluation's own batch, which the training micro-batch
    does not size (the Trainer's `per_device_eval_batch_size`)."""
    frame = ctx.classification.fields.get("frame")
    if ctx.classification.fields.get("phase") != "evaluation":
        return "the failure was not in evaluation"
    if not ctx.has("eval_batch_size"):
        return f"it ran out in evaluation ({frame}), and the run names no evaluation batch (role eval_batch)"
    batch = _int_knob(ctx, "eval_batch_size", 1)
    floor = rung.min or 1
    if batch <= floor:
        return f"evaluation batch {batch} is the minimum ({floor})"
    new = max(floor, min(batch - 1, math.floor(batch * (rung.factor or DEFAULT_FACTOR))))
    return RetuneDecision(
        action=rung.action,
        changes={"eval_batch_size": (batch, new)},
        reason=(
            f"{ctx.classification.reason}; it ran out in evaluation ({frame}), whose batch the training "
            f"micro-batch does not size: evaluation batch {batch} → {new}, training unchanged"
        ),
    )


def _format_budget(num_bytes: int) -> str:
    mib = num_bytes >> 20
    return f"{mib >> 10}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def _gpu_keys(budget: dict[str, Any]) -> list[str]:
    return [k for k in budget if str(k).isdigit()]


class _CannotLower(Exception):
    """A GPU budget that is not a size or is already at the minimum; the message says which."""


def _lowered(value: Any, factor: float, name: str) -> str:
    """The budget `value` × `factor`, formatted as accelerate reads it."""
    try:
        old = parse_size(str(value))
    except ValueError:
        raise _CannotLower(f"{name} is not a size") from None
    new = max(MIN_GPU_BUDGET, math.floor(old * factor))
    if new >= old:
        raise _CannotLower(f"GPU budget {value} is at the minimum ({format_size(MIN_GPU_BUDGET)})")
    return _format_budget(new)


def _offload(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    """Lower a GPU budget already set (per GPU for accelerate, one size for a command), or set one."""
    if not ctx.has("max_memory"):
        return "the run has no max_memory knob (offload is for inference with accelerate)"
    current = ctx.knobs.get("max_memory")
    factor = rung.factor or DEFAULT_OFFLOAD_FACTOR
    lowered: Any
    try:
        if isinstance(current, dict) and _gpu_keys(current) and ctx.knobs.get("device_map") == "auto":
            per_gpu = {
                k: _lowered(current[k], factor, f"max_memory[{k}] = {current[k]!r}")
                for k in _gpu_keys(current)
            }
            lowered = {**current, **per_gpu}
        elif isinstance(current, str) and ctx.kind == "command":
            lowered = _lowered(current, factor, f"max_memory {current!r}")
        else:
            return _first_offload(ctx, rung)
    except _CannotLower as exc:
        return str(exc)
    what = f"lower the GPU budget ×{factor}: {current} → {lowered}"
    return _offload_decision(ctx, rung, {"max_memory": (current, lowered)}, what)


def _first_offload(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    """A budget of a share of the card (and the CPU memory the rung allows), with device_map auto."""
    capacity = ctx.memory_capacity()
    if capacity is None:
        return "the card's memory is unknown, so no GPU budget can be set"
    budget_bytes = max(MIN_GPU_BUDGET, math.floor(capacity * (rung.gpu_fraction or DEFAULT_GPU_FRACTION)))
    budget: dict[str, str] = {"0": _format_budget(budget_bytes)}
    if rung.cpu_memory:
        budget["cpu"] = rung.cpu_memory
    changes: dict[str, tuple[Any, Any]] = {"max_memory": (ctx.knobs.get("max_memory"), budget)}
    device_map = ctx.knobs.get("device_map")
    if ctx.has("device_map") and device_map != "auto":
        changes["device_map"] = (device_map, "auto")
    return _offload_decision(
        ctx, rung, changes, f"offload what does not fit: max_memory {budget}, device_map auto"
    )


def _offload_decision(
    ctx: _Context, rung: Rung, changes: dict[str, tuple[Any, Any]], what: str
) -> RetuneDecision:
    return RetuneDecision(
        action=rung.action,
        changes=changes,
        reason=f"{ctx.classification.reason}; {what} (slower, layers beyond the budget run from CPU)",
    )


def _wait(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    limit = rung.max_times or DEFAULT_MAX_TIMES[rung.action]
    used = ctx.times_used(rung.action)
    seconds = rung.seconds or DEFAULT_WAIT_SECONDS
    return RetuneDecision(
        action=rung.action,
        reason=f"{ctx.classification.reason}; wait {seconds:g} s for the other processes to free memory "
        f"(wait {used + 1} of {limit}), then restart unchanged",
        wait_s=seconds,
    )


def _move(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    if ctx.knobs.get("other_gpus") == 0:
        return "no other GPU to move to"
    return RetuneDecision(
        action=rung.action,
        reason=f"{ctx.classification.reason}; restart unchanged on the GPU with the most free memory",
    )


def _world_size(ctx: _Context, rung: Rung) -> RetuneDecision | str:
    """Fewer ranks on the GPUs still usable; more accumulation keeps the effective batch."""
    if not ctx.has("world_size") or ctx.knobs.get("fixed_world_size"):
        return "the run has no world_size knob"
    if not ctx.policy.allows("world_size"):
        return "a smaller gang runs slower and the policy does not allow it (add world_size to `allow`)"
    world = _int_knob(ctx, "world_size", 1)
    if world <= 1:
        return "the run is a single process"
    usable = ctx.knobs.get("usable_gpus")
    if not isinstance(usable, int) or isinstance(usable, bool):
        return "how many GPUs the gang could use is not known"
    if usable >= world:
        return f"{usable} GPUs are usable, enough for all {world} ranks"
    if ctx.kind == "command" and not ctx.has("grad_accum_steps"):
        return "the run has no grad_accum_steps knob, so the effective batch cannot be kept"
    accum = _int_knob(ctx, "grad_accum_steps", 1)
    floor = rung.min or 1
    options = [w for w in range(floor, min(usable, world - 1) + 1) if (accum * world) % w == 0]
    if not options:
        return f"no world size from {floor} to {usable} divides accumulation × world size ({accum * world})"
    new = max(options)
    new_accum = accum * world // new
    micro = _int_knob(ctx, "batch_size", 1)
    return RetuneDecision(
        action=rung.action,
        changes={"world_size": (world, new), "grad_accum_steps": (accum, new_accum)},
        reason=(
            f"{ctx.classification.reason}; {usable} GPU(s) usable: world size {world} → {new}, "
            f"accumulation {accum} → {new_accum}, effective batch {micro * accum * world} kept"
        ),
    )


# Rungs that lower only the memory growing with the batch or the input (activations), or per-rank
# work: no help when the fixed part alone does not fit.
_GROWS_WITH_BATCH = frozenset(
    {
        "reduce_micro_batch",
        "reduce_generation_batch",
        "reduce_eval_batch",
        "gradient_checkpointing",
        "reduce_max_length",
        "reduce_max_pixels",
        "reduce_max_new_tokens",
        "reduce_world_size",
    }
)


def _lowers_only_what_grows(ctx: _Context, action: str) -> bool:
    """Whether the rung leaves the weights, gradients and optimizer state as they are: the
    built-in trainer's 16-bit precision is autocast (fp32 weights and state), while a command's
    precision knob may cast the weights."""
    return action in _GROWS_WITH_BATCH or (action == "lower_precision" and ctx.kind == "train")


_HANDLERS: dict[str, _Handler] = {
    "allocator_expandable_segments": _allocator,
    "reduce_micro_batch": _micro_batch,
    "gradient_checkpointing": _flag("gradient_checkpointing", "gradient checkpointing"),
    "lower_precision": _precision,
    "reduce_max_length": _semantic("max_length"),
    "reduce_max_pixels": _semantic("max_pixels"),
    "reduce_max_new_tokens": _semantic("max_new_tokens"),
    "offload": _offload,
    "load_in_8bit": _flag("load_in_8bit", "8-bit weights"),
    "reduce_generation_batch": _generation_batch,
    "reduce_eval_batch": _eval_batch,
    "wait_for_memory": _wait,
    "move_gpu": _move,
    "reduce_world_size": _world_size,
}


def _change_effective_batch(ctx: _Context) -> RetuneDecision | str:
    """Last resort when the user allows it: a smaller micro-batch with the same accumulation."""
    if ctx.kind == "infer":
        return "inference has no effective batch"
    if not ctx.has("batch_size"):
        return "the run has no batch_size knob"
    micro = _int_knob(ctx, "batch_size", 1)
    accum = _int_knob(ctx, "grad_accum_steps", 1)
    world = _int_knob(ctx, "world_size", 1)
    floor = ctx.policy.min_micro_batch
    if micro <= floor:
        return f"micro-batch {micro} is the minimum (min_micro_batch {floor})"
    prediction = ctx.predict(micro)
    target = prediction.batch if prediction.batch is not None else micro // 2
    new = max(floor, min(target, micro - 1))
    scale = new / micro
    old_eff, new_eff = micro * accum * world, new * accum * world
    return RetuneDecision(
        action="reduce_micro_batch",
        changes={"batch_size": (micro, new)},
        lr_scale=scale,
        reason=(
            f"{ctx.classification.reason}; the ladder kept the effective batch as long as it could; "
            f"effective batch {old_eff} → {new_eff} (allowed by the policy), learning rate scaled "
            f"×{scale:g} (linear scaling rule)"
        ),
        prediction=prediction.to_dict(),
    )


def decide(
    classification: Classification,
    policy: RetunePolicy,
    *,
    kind: str,
    knobs: dict[str, Any],
    history: list[dict[str, Any]],
    memory_points: list[tuple[int, int]],
    capacity: int | None,
    attempts_so_far: int,
    elapsed_s: float,
    env: dict[str, str],
    ooms: tuple[int, ...] = (),
    fixed_at_least: int | None = None,
) -> RetuneDecision:
    """The change for the next restart, or a give-up with its reason.

    `knobs` are the current values (train: batch_size, grad_accum_steps, world_size, max_length,
    gradient_checkpointing, precision; infer: batch_size, max_new_tokens, max_pixels, precision,
    max_memory, device_map, load_in_8bit; command: the spec's knobs). Optional hints in knobs:
    `resolved_precision`, `bf16_supported`, `device`, `other_gpus`, `usable_gpus` (GPUs a
    gang could run on now), `fixed_world_size` (a command run's world size that is no knob).
    `history`: the earlier decisions' `to_dict()`. `memory_points`: (micro_batch, peak_bytes);
    `capacity`: the memory that ran out; `ooms`: sizes that ran out in probes; `fixed_at_least`:
    what the run reported it holds whatever the batch, in that memory.
    """
    if kind not in RUN_KINDS:
        raise ValueError(f"unknown run kind {kind!r}; expected one of {', '.join(RUN_KINDS)}")
    refusal = _refusal(classification, policy, attempts_so_far=attempts_so_far, elapsed_s=elapsed_s)
    if refusal is not None:
        return _give_up(refusal)
    ctx = _Context(
        classification, policy, kind, knobs, history, memory_points, capacity, env, ooms, fixed_at_least
    )
    rungs = [(index, rung) for index, rung in enumerate(policy.ladder) if classification.verdict in rung.when]
    return _walk(ctx, rungs)


def _walk(ctx: _Context, rungs: list[tuple[int, Rung]]) -> RetuneDecision:
    """The first of the rungs that acts; else the give-up that says why none did."""
    climbed = _climb(ctx, rungs)
    if isinstance(climbed, RetuneDecision):
        return climbed
    verdict, reason = ctx.classification.verdict, ctx.classification.reason
    if ctx.kind == "command" and rungs and not RETUNABLE & ctx.knobs.keys():
        # A script run as it is: a rung-by-rung list of knobs it lacks buries the one step that
        # makes it retunable.
        return _give_up(f"not retuned: {verdict}, and the run names no setting {NAME_A_SETTING}")
    skipped = climbed
    fixed = _fixed_give_up(ctx, skipped) or _unshrinking_give_up(ctx)
    if fixed is not None:
        return fixed
    if any(rung.action == "reduce_micro_batch" for _, rung in rungs) and ctx.policy.allows("effective_batch"):
        outcome = _change_effective_batch(ctx)
        if isinstance(outcome, RetuneDecision):
            return outcome
        skipped.append(f"effective batch: {outcome}")
    prediction = ctx.prediction.to_dict() if ctx.prediction is not None else None
    if not rungs:
        policy = ctx.policy.name or "(inline)"
        return _give_up(f"no rung of policy {policy} answers {verdict} ({reason})", prediction)
    return _give_up(f"retune ladder exhausted for {verdict} ({reason}): " + "; ".join(skipped), prediction)


def _fixed_give_up(ctx: _Context, skipped: list[str]) -> RetuneDecision | None:
    """The give-up when the fixed memory alone exceeds the limit: that, the fix, and the rungs
    that did not apply for reasons of their own."""
    fixed = ctx.fixed_exceeds()
    if fixed is None:
        return None
    others = [s for s in skipped if "grows with the batch" not in s]
    return _give_up(
        f"not retuned: {fixed}, so no smaller batch or input fits — give the run more memory "
        "or train a smaller model" + (f" (other rungs: {'; '.join(others)})" if others else ""),
        ctx.predict(_int_knob(ctx, "batch_size", 1)).to_dict() if ctx.has("batch_size") else None,
    )


def _unshrinking_give_up(ctx: _Context) -> RetuneDecision | None:
    """The give-up when lowering the micro-batch stopped changing what failed: that, and the fix
    (the ladder's other rungs had their turn before this one was reached)."""
    if ctx.unshrinking is None:
        return None
    return _give_up(
        f"not retuned further: {ctx.unshrinking} — give the run more memory, or make the program "
        "hold less of what it keeps whatever the batch"
    )


def _refusal(
    classification: Classification, policy: RetunePolicy, *, attempts_so_far: int, elapsed_s: float
) -> str | None:
    """Why no rung is tried at all: a failure no retune fixes, or the policy's attempts or time spent."""
    if not classification.retunable:
        return f"{classification.verdict}: {classification.reason} — retuning cannot fix this"
    if attempts_so_far >= policy.max_attempts:
        return (
            f"gave up after {attempts_so_far} retune attempts (policy max_attempts {policy.max_attempts}); "
            f"last failure: {classification.reason}"
        )
    if policy.max_total_seconds is not None and elapsed_s >= policy.max_total_seconds:
        return (
            f"gave up after {elapsed_s:.0f} s of retuning (policy max_total_seconds "
            f"{policy.max_total_seconds:g}); last failure: {classification.reason}"
        )
    return None


def _climb(ctx: _Context, rungs: list[tuple[int, Rung]]) -> RetuneDecision | list[str]:
    """The first of `rungs` (index in the ladder, rung) that acts; else why each one did not."""
    skipped: list[str] = []
    for index, rung in rungs:
        limit = rung.max_times or DEFAULT_MAX_TIMES.get(rung.action)
        used = ctx.times_used(rung.action)
        if limit is not None and used >= limit:
            skipped.append(f"{rung.action}: used {used} times (max_times {limit})")
            continue
        if _lowers_only_what_grows(ctx, rung.action) and ctx.fixed_exceeds():
            skipped.append(f"{rung.action}: lowers only memory that grows with the batch")
            continue
        outcome = _HANDLERS[rung.action](ctx, rung)
        if isinstance(outcome, RetuneDecision):
            return replace(outcome, rung=index)
        skipped.append(f"{rung.action}: {outcome}")
    return skipped


def effective_batch(knobs: dict[str, Any]) -> int | None:
    """micro × accumulation × world size from knobs, or None without a batch size."""
    micro = knobs.get("batch_size")
    if not isinstance(micro, int):
        return None
    return micro * int(knobs.get("grad_accum_steps", 1)) * int(knobs.get("world_size", 1))


__all__ = [
    "ALLOC_VARIABLES",
    "KIND_KNOBS",
    "RUN_KINDS",
    "RetuneDecision",
    "decide",
    "effective_batch",
    "memory_capacity",
]
