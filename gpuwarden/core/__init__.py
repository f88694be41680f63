"""Headless core: config models, event schema, store, telemetry readers, OOM maths.

Nothing here may import torch, transformers, textual or rich (checked by import-linter and by
tests/test_layers.py): the daemon is built from this layer and must stay small.
"""
