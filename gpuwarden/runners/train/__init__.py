"""The training runner: `main.run` is the body `python -m gpuwarden.runners` calls for `kind: train`.

Modules: `loop` (the optimisation loop, checkpoints, OOM and SIGTERM handling), `sampling` (the
sample-position data order), `task` (the interface a task implements), `causal_lm` and `image`
(the two tasks).
"""
