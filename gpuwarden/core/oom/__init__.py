"""Out-of-memory handling: classify a failure, pick the next change from a retune policy.

`classify` reads error text and exceptions, `policy` loads retune ladders from YAML, `retune`
decides the next restart's change, `memory_model` predicts the largest micro-batch that fits,
and `profiles` gives starting points per GPU memory tier. Pure functions, no torch.

The package itself imports none of them: `gpuwarden show` reads a retune with `explain` and
needs no classifier.
"""
