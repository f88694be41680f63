"""The edit dialog's knobs: those of the run's kind that mean something to its task."""

from __future__ import annotations

from gpuwarden.tui.knobs import current_knobs

TRAIN: dict[str, object] = {"batch_size": 8, "grad_accum_steps": 1, "world_size": 1, "max_length": 512}
TRAIN |= {"gradient_checkpointing": False, "precision": "auto"}


def test_an_image_model_is_not_offered_a_sequence_length() -> None:
    knobs = current_knobs("train", {"train": {"task": "image", **TRAIN}})
    assert list(knobs) == [
        "batch_size",
        "grad_accum_steps",
        "precision",
        "gradient_checkpointing",
        "world_size",
    ]


def test_a_language_model_keeps_its_sequence_length() -> None:
    knobs = current_knobs("train", {"train": {"task": "causal_lm", **TRAIN}})
    assert knobs["max_length"] == 512 and list(knobs)[:4] == [
        "batch_size",
        "grad_accum_steps",
        "precision",
        "max_length",
    ]


def test_only_image_inference_is_offered_an_image_size() -> None:
    infer: dict[str, object] = {
        "batch_size": 4,
        "max_new_tokens": 64,
        "max_pixels": None,
        "precision": "auto",
    }
    assert "max_pixels" not in current_knobs("infer", {"infer": {"task": "generate", **infer}})
    assert "max_pixels" in current_knobs("infer", {"infer": {"task": "image_to_text", **infer}})
