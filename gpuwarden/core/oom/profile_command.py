"""`profile: auto` for a user's own program: the memory tier's starting split of the batch.

A command run's knobs all have values (from its flags or config file), so "fill what the user
left unset" cannot apply; asking for a profile on a command run asks for the tier's starting
point instead. Only what keeps the training the same is taken: the tier's micro-batch as the
split of the program's own effective batch (the largest divisor of micro × accumulation not above
the tier's micro-batch, the accumulation making up the rest), and gradient checkpointing where
the program has that knob. Shapes (max_length) and precision stay the program's; the retune
ladder corrects a starting point that does not fit.

The tier's row is the causal-LM one for a Hugging Face Trainer program or one with a
`max_length` role, the image one for a program with a `max_pixels` role; other programs say
nothing about what they train, and the profile says so instead of guessing.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.oom.profiles import profile_for


def command_task(spec: RunSpec) -> str | None:
    """The profile row a command run's program matches, or None when nothing tells."""
    assert spec.command is not None
    roles = spec.command.roles.knob_names()
    if spec.command.framework == "transformers" or "max_length" in roles:
        return "causal_lm"
    if "max_pixels" in roles:
        return "image"
    return None


def _largest_divisor_up_to(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, max(cap, 1)) + 1) if n % d == 0)


def command_profile(spec: RunSpec, memory_total: int) -> tuple[dict[str, Any], str]:
    """({knob: new value} for the knobs the tier changes, one line saying what happened)."""
    assert spec.command is not None
    roles = spec.command.roles.knob_names()
    task = command_task(spec)
    if task is None or "micro_batch" not in roles:
        return {}, (
            "profile: auto on a command run needs a micro-batch role and a program the tiers know "
            "(framework: transformers, or a max_length or max_pixels role); the spec's own values are used"
        )
    values = profile_for(memory_total, "train", task)
    tier = values["tier"]
    micro = int(spec.knobs[roles["micro_batch"]])
    accum_knob = roles.get("accum_steps")
    accum = int(spec.knobs[accum_knob]) if accum_knob else 1
    changes: dict[str, Any] = {}
    wanted = int(values.get("batch_size", micro))
    # Without an accumulation knob the effective batch can only be kept at the program's micro-batch.
    new_micro = _largest_divisor_up_to(micro * accum, wanted) if accum_knob else micro
    if new_micro != micro:
        changes[roles["micro_batch"]] = new_micro
        changes[str(accum_knob)] = micro * accum // new_micro
    checkpointing = values.get("gradient_checkpointing")
    gc_knob = roles.get("gradient_checkpointing")
    if gc_knob and isinstance(checkpointing, bool) and spec.knobs.get(gc_knob) != checkpointing:
        changes[gc_knob] = checkpointing
    if not changes:
        return {}, f"profile {tier}: the program's micro-batch split already matches the tier"
    said = ", ".join(f"knobs.{k}={v}" for k, v in changes.items())
    return changes, f"profile {tier} ({task} row, effective batch kept): {said}"


__all__ = ["command_profile", "command_task"]
