"""Whether an out-of-memory happened in evaluation, from real tracebacks as stderr holds them."""

from __future__ import annotations

import traceback

from gpuwarden.core.oom.failure_phase import evaluation_frame


def _allocate() -> None:
    raise MemoryError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 268435456 bytes")


def evaluation_loop() -> None:
    _allocate()


def evaluate() -> None:
    evaluation_loop()


def training_step() -> None:
    _allocate()


def _validate_args() -> None:
    training_step()


def _printed(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except MemoryError:
        return "step 12 loss 0.3\n" + traceback.format_exc()
    raise AssertionError("it did not fail")


def test_a_traceback_through_evaluation_names_the_frame() -> None:
    assert evaluation_frame(_printed(evaluate)) == "evaluation_loop"  # the innermost


def test_training_and_argument_checks_are_not_evaluation() -> None:
    assert evaluation_frame(_printed(training_step)) is None
    assert evaluation_frame(_printed(_validate_args)) is None
    assert evaluation_frame("no traceback here") is None


def test_the_last_chain_of_exceptions_counts_not_an_earlier_traceback() -> None:
    earlier = _printed(evaluate)  # an evaluation that failed and was handled, long before
    assert evaluation_frame(earlier + "recovered\n" + _printed(training_step)) is None

    def reraised() -> None:
        try:
            evaluate()
        except MemoryError as exc:
            raise RuntimeError("CUDA out of memory while evaluating") from exc

    try:
        reraised()
    except RuntimeError:
        chained = traceback.format_exc()
    assert "The above exception was the direct cause" in chained
    assert evaluation_frame(chained) == "evaluation_loop"
