"""gpuwarden's own run bodies: training and inference processes started by the daemon.

Everything here may import torch and transformers; nothing here imports the daemon or the TUI.
Entry point: `python -m gpuwarden.runners --spec RESOLVED.yaml --run-dir RUN_DIR` (see
`__main__.py` for the launch contract).
"""
