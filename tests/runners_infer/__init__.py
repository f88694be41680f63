"""Tests of the inference runner (gpuwarden.runners.infer)."""
