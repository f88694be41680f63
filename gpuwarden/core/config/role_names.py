"""The parts a command run's knobs can play (`command.roles`), each with the name the retune
maths gives it. Its own module: reading a stored spec's effective batch needs these names, not
the spec's models.
"""

from __future__ import annotations

# Role → the name the retune maths uses for it (the built-in training runner's knob names).
ROLE_NAMES: dict[str, str] = {
    "micro_batch": "batch_size",
    "eval_batch": "eval_batch_size",
    "accum_steps": "grad_accum_steps",
    "world_size": "world_size",
    "max_length": "max_length",
    "max_pixels": "max_pixels",
    "max_new_tokens": "max_new_tokens",
    "gradient_checkpointing": "gradient_checkpointing",
    "precision": "precision",
}
