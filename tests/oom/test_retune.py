"""decide(): one change per restart, the effective batch kept exactly, and clear give-ups."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.core.oom.classify import Classification, Verdict, classify_text
from gpuwarden.core.oom.policy import (
    PACKAGE_POLICY_DIR,
    PolicyOverride,
    RetunePolicy,
    load_policy,
    resolve_policy,
)
from gpuwarden.core.oom.retune import RetuneDecision, decide, effective_batch

GiB = 1 << 30
DIRS = [PACKAGE_POLICY_DIR]


def verdict(v: Verdict, **fields: Any) -> Classification:
    return Classification(v, "", dict(fields), f"{v} (test)")


CAPACITY = verdict("gpu_capacity", device="cuda")


def policy(name: str = "default", **overrides: Any) -> RetunePolicy:
    if not overrides:
        return load_policy(name, search_dirs=DIRS)
    return resolve_policy(PolicyOverride.model_validate({"base": name, **overrides}), search_dirs=DIRS)


def train_knobs(**values: Any) -> dict[str, Any]:
    knobs: dict[str, Any] = {
        "batch_size": 8,
        "grad_accum_steps": 1,
        "world_size": 1,
        "max_length": 1024,
        "gradient_checkpointing": False,
        "precision": "fp32",
    }
    knobs.update(values)
    return knobs


def run(
    classification: Classification = CAPACITY,
    pol: RetunePolicy | None = None,
    *,
    kind: str = "train",
    knobs: dict[str, Any] | None = None,
    history: list[dict[str, Any]] | None = None,
    points: list[tuple[int, int]] | None = None,
    capacity: int | None = 24 * GiB,
    attempts: int = 0,
    elapsed: float = 0.0,
    env: dict[str, str] | None = None,
) -> RetuneDecision:
    return decide(
        classification,
        pol or policy(),
        kind=kind,
        knobs=train_knobs() if knobs is None else knobs,
        history=history or [],
        memory_points=points or [],
        capacity=capacity,
        attempts_so_far=attempts,
        elapsed_s=elapsed,
        env=env or {},
    )


# -------------------------------------------------------------------------------- micro-batch


def test_prediction_jumps_to_largest_divisor() -> None:
    # fixed 10 GiB + 1 GiB per sample, 21 GiB card, 8 % headroom on the 1 GiB a sample adds:
    # 10 + 1.08 × b ≤ 21 → the model predicts 10.
    points = [(2, 12 * GiB), (4, 14 * GiB)]
    d = run(knobs=train_knobs(batch_size=64, grad_accum_steps=1), points=points, capacity=21 * GiB)
    assert d.action == "reduce_micro_batch"
    assert d.prediction is not None and d.prediction["batch"] == 10
    assert d.changes == {"batch_size": (64, 8), "grad_accum_steps": (1, 8)}
    assert d.lr_scale is None and d.give_up is None
    assert "effective batch 64 kept" in d.reason
    assert d.apply(train_knobs(batch_size=64))["grad_accum_steps"] == 8


def test_no_prediction_halves_along_divisors() -> None:
    d = run(knobs=train_knobs(batch_size=12, grad_accum_steps=2))
    # divisors of 24 below 12: 1 2 3 4 6 8; largest ≤ 12 // 2 = 6
    assert d.changes == {"batch_size": (12, 6), "grad_accum_steps": (2, 4)}


def test_divisors_walked_not_a_factor() -> None:
    # micro 9 × accum 1: halving gives 4, which does not divide 9 → 3 with accum 3.
    d = run(knobs=train_knobs(batch_size=9))
    assert d.changes == {"batch_size": (9, 3), "grad_accum_steps": (1, 3)}


def test_successive_restarts_walk_down_to_one() -> None:
    knobs = train_knobs(batch_size=16, grad_accum_steps=1, gradient_checkpointing=True, precision="bf16")
    seen = []
    for _ in range(6):
        d = run(knobs=knobs)
        if d.action != "reduce_micro_batch":
            break
        knobs = d.apply(knobs)
        seen.append((knobs["batch_size"], knobs["grad_accum_steps"]))
    assert seen == [(8, 2), (4, 4), (2, 8), (1, 16)]
    assert d.give_up is not None


def test_a_failed_allocation_that_does_not_shrink_stops_the_micro_batch_after_two_lowerings() -> None:
    # 64, 32 and 16 each failed allocating the same 2 GiB of a 24 GiB card: held whatever the
    # micro-batch, so 8 would fail the same; the ladder goes on to its other rungs.
    knobs = train_knobs(batch_size=64, grad_accum_steps=1)
    history: list[dict[str, Any]] = []
    failed = verdict("gpu_capacity", device="cuda", requested=2 * GiB)
    for _ in range(2):
        d = run(failed, knobs=knobs, history=history)
        assert d.action == "reduce_micro_batch" and d.request == 2 * GiB
        knobs, history = d.apply(knobs), [*history, d.to_dict()]
    d = run(failed, knobs=knobs, history=history)
    assert d.action == "gradient_checkpointing" and knobs["batch_size"] == 16
    said = run(failed, knobs=knobs, history=history, pol=policy(ladder=[{"action": "reduce_micro_batch"}]))
    assert said.give_up is not None and said.give_up.startswith(
        "not retuned further: micro-batch 64, 32 and 16 each failed allocating the same 2.0 GiB: that "
        "memory does not shrink with the micro-batch"
    )
    assert said.give_up.endswith(
        "give the run more memory, or make the program hold less of what it keeps whatever the batch"
    )
    # What shrank, a block too small to prove anything, or a chain broken by another rung: lowered.
    for other in (
        verdict("gpu_capacity", device="cuda", requested=GiB),
        verdict("gpu_capacity", device="cuda", requested=2 << 20),
    ):
        small = (
            [{**h, "request": 2 << 20} for h in history] if other.fields["requested"] == 2 << 20 else history
        )
        assert run(other, knobs=knobs, history=small).changes["batch_size"] == (16, 8)
    broken = [{"action": "allocator", "changes": {}}, history[1]]
    assert run(failed, knobs=knobs, history=broken).changes["batch_size"] == (16, 8)


def test_min_micro_batch_bound() -> None:
    pol = policy(min_micro_batch=4)
    d = run(
        pol=pol,
        knobs=train_knobs(batch_size=8, grad_accum_steps=1),
        points=[(1, 23 * GiB), (2, 23 * GiB + 1)],
    )
    assert d.changes["batch_size"] == (8, 4)
    d2 = run(pol=pol, knobs=train_knobs(batch_size=4, grad_accum_steps=2))
    assert d2.action == "gradient_checkpointing"


def test_prediction_nothing_fits_takes_smallest_divisor() -> None:
    d = run(knobs=train_knobs(batch_size=8), points=[(1, 30 * GiB), (2, 31 * GiB)])
    assert d.changes["batch_size"] == (8, 1)


def test_allowed_cap_in_message_is_the_capacity() -> None:
    # Emulated smaller card: the allocator cap (allowed) is what ran out, not the card.
    c = verdict("gpu_capacity", device="cuda", allowed=16 * GiB, total=80 * GiB)
    d = run(c, knobs=train_knobs(batch_size=64), points=[(2, 12 * GiB), (4, 14 * GiB)], capacity=80 * GiB)
    assert d.prediction is not None and d.prediction["capacity"] == 16 * GiB
    assert d.changes["batch_size"] == (64, 4)  # 16 × 0.92 = 14.72 GiB → 4


@given(
    micro=st.integers(min_value=1, max_value=256),
    accum=st.integers(min_value=1, max_value=64),
    world=st.integers(min_value=1, max_value=16),
    predicted=st.one_of(st.none(), st.integers(min_value=0, max_value=300)),
    min_micro=st.integers(min_value=1, max_value=8),
)
def test_effective_batch_is_preserved_exactly(
    micro: int, accum: int, world: int, predicted: int | None, min_micro: int
) -> None:
    knobs = train_knobs(
        batch_size=micro,
        grad_accum_steps=accum,
        world_size=world,
        gradient_checkpointing=True,
        precision="bf16",
    )
    points: list[tuple[int, int]] = []
    capacity = 100 * GiB
    if predicted is not None:
        # A line whose prediction under 0 % headroom is exactly `predicted`.
        points = [(1, capacity - predicted * GiB), (2, capacity - predicted * GiB + GiB)]
        points = [(b, max(p, 0)) for b, p in points]
    pol = policy(min_micro_batch=min_micro, headroom=0.0)
    d = run(pol=pol, knobs=knobs, points=points, capacity=capacity)
    if d.action == "reduce_micro_batch":
        new = d.apply(knobs)
        assert effective_batch(new) == micro * accum * world
        assert new["batch_size"] * new["grad_accum_steps"] == micro * accum
        assert min_micro <= new["batch_size"] < micro
        assert (micro * accum) % new["batch_size"] == 0
        assert d.lr_scale is None
    else:
        # No divisor of micro × accum lies in [min_micro, micro): nothing can shrink.
        assert not [x for x in range(min_micro, micro) if (micro * accum) % x == 0]
        assert d.give_up is not None


# ------------------------------------------------------------------------------ ladder order


def test_fragmentation_sets_allocator_first() -> None:
    frag = verdict("gpu_fragmentation", device="cuda")
    d = run(frag)
    assert d.action == "allocator_expandable_segments"
    assert d.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert d.changes == {}
    assert d.rung == 0
    again = run(frag, env=d.env)
    assert again.action == "reduce_micro_batch"


def test_allocator_merges_with_existing_setting() -> None:
    frag = verdict("gpu_fragmentation", device="cuda")
    d = run(frag, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    assert d.env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    respected = run(frag, env={"PYTORCH_ALLOC_CONF": "expandable_segments:False"})
    assert respected.action == "reduce_micro_batch"
    assert run(verdict("gpu_fragmentation", device="mps")).action == "reduce_micro_batch"


def test_capacity_skips_allocator_rung() -> None:
    assert run().action == "reduce_micro_batch"


def test_contention_waits_then_moves_never_shrinks() -> None:
    busy = verdict("gpu_contention", device="cuda")
    history: list[dict[str, Any]] = []
    actions = []
    for _ in range(6):
        d = run(busy, history=history)
        actions.append(d.action)
        assert "batch_size" not in d.changes
        if d.give_up:
            break
        history.append(d.to_dict())
    assert actions == ["wait_for_memory"] * 3 + ["move_gpu", "give_up"]
    first = run(busy)
    assert first.wait_s == 120
    assert run(busy, knobs=train_knobs(other_gpus=0), history=[{"action": "wait_for_memory"}] * 3).give_up


def test_checkpointing_then_precision_after_micro_batch_one() -> None:
    knobs = train_knobs(batch_size=1, grad_accum_steps=8)
    d = run(knobs=knobs)
    assert d.action == "gradient_checkpointing"
    assert d.changes == {"gradient_checkpointing": (False, True)}
    knobs = d.apply(knobs)
    d = run(knobs=knobs)
    assert d.action == "lower_precision"
    assert d.changes == {"precision": ("fp32", "bf16")}
    assert run(
        knobs=train_knobs(bf16_supported=False, batch_size=1, gradient_checkpointing=True)
    ).changes == {"precision": ("fp32", "fp16")}
    resolved = train_knobs(
        batch_size=1, gradient_checkpointing=True, precision="auto", resolved_precision="bf16"
    )
    assert run(knobs=resolved).give_up is not None


def test_semantic_changes_only_when_allowed() -> None:
    knobs = train_knobs(batch_size=1, gradient_checkpointing=True, precision="bf16", max_length=1000)
    refused = run(knobs=knobs)
    assert refused.give_up is not None
    assert "add max_length to `allow`" in refused.give_up
    allowed = run(pol=policy(allow=["max_length"]), knobs=knobs)
    assert allowed.action == "reduce_max_length"
    assert allowed.changes == {"max_length": (1000, 448)}  # 500 rounded down to a multiple of 64


def test_exhausted_ladder_gives_up_with_every_reason() -> None:
    knobs = train_knobs(batch_size=1, grad_accum_steps=4, gradient_checkpointing=True, precision="bf16")
    d = run(knobs=knobs)
    assert d.action == "give_up"
    assert d.give_up is not None and d.give_up == d.reason
    assert d.give_up.startswith("retune ladder exhausted for gpu_capacity")
    assert "reduce_micro_batch: micro-batch 1 is the minimum" in d.give_up
    assert "gradient_checkpointing: gradient checkpointing is already on" in d.give_up
    assert "offload: the run has no max_memory knob" in d.give_up


def test_effective_batch_change_only_when_allowed_and_ladder_exhausted() -> None:
    knobs = train_knobs(batch_size=7, grad_accum_steps=1, gradient_checkpointing=True, precision="bf16")
    pol = policy(min_micro_batch=2, allow=["effective_batch"])
    d = run(pol=pol, knobs=knobs)
    # 7 is prime: no divisor in [2, 7); the ladder is exhausted; the user allowed the change.
    assert d.action == "reduce_micro_batch"
    assert d.changes == {"batch_size": (7, 3)}
    assert d.lr_scale == pytest.approx(3 / 7)
    assert "effective batch 7 → 3" in d.reason and "learning rate" in d.reason
    not_allowed = run(pol=policy(min_micro_batch=2), knobs=knobs)
    assert not_allowed.give_up is not None
    # While checkpointing is still off, it is tried before the effective batch changes.
    assert run(pol=pol, knobs=dict(knobs, gradient_checkpointing=False)).action == "gradient_checkpointing"


@pytest.mark.parametrize("v", ["shape_bug", "not_oom"])
def test_not_retunable_gives_up_immediately(v: Verdict) -> None:
    d = run(verdict(v))
    assert d.action == "give_up"
    assert d.give_up == f"{v}: {v} (test) — retuning cannot fix this"
    assert d.changes == {} and d.env == {}


def test_shape_bug_from_real_message() -> None:
    c = classify_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7178.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 77.00 GiB is free."
    )
    d = run(c)
    assert d.give_up is not None and "larger than the whole card" in d.give_up


def test_bounds() -> None:
    d = run(attempts=8)
    assert d.give_up is not None and "max_attempts 8" in d.give_up
    timed = run(pol=policy("conservative"), elapsed=7200)
    assert timed.give_up is not None and "max_total_seconds 7200" in timed.give_up
    assert run(pol=policy("conservative"), elapsed=7199).action == "reduce_micro_batch"


def test_verdict_no_rung_answers() -> None:
    pol = RetunePolicy.model_validate({"ladder": [{"action": "gradient_checkpointing"}]})
    d = run(verdict("gpu_contention"), pol=pol)
    assert d.give_up is not None and "no rung of policy (inline) answers gpu_contention" in d.give_up


def test_host_oom_shrinks_batch() -> None:
    host = classify_text(
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 4000000000 bytes. Error code 12 (Cannot allocate memory)"
    )
    # RSS peaks on the host: 0.95 GB at 4, 2.7 GB at 16 (machine-facts.md), 6 GiB limit.
    d = run(
        host,
        knobs=train_knobs(batch_size=64),
        points=[(4, 950_000_000), (16, 2_700_000_000)],
        capacity=6 * GiB,
    )
    assert d.action == "reduce_micro_batch"
    assert d.prediction is not None and d.prediction["capacity"] == 6 * GiB
    new = d.apply(train_knobs(batch_size=64))
    assert new["batch_size"] * new["grad_accum_steps"] == 64
    assert new["batch_size"] == 32  # predicts 37: the largest divisor of 64 under it


# --------------------------------------------------------------------------------- inference


def infer_knobs(**values: Any) -> dict[str, Any]:
    knobs: dict[str, Any] = {
        "batch_size": 8,
        "max_new_tokens": 1024,
        "max_pixels": 786432,
        "precision": "bf16",
        "max_memory": None,
        "device_map": None,
        "load_in_8bit": False,
    }
    knobs.update(values)
    return knobs


def test_inference_ladder_order() -> None:
    pol = policy("inference", allow=["max_pixels", "max_new_tokens"])
    knobs = infer_knobs(batch_size=4, precision="fp32")
    actions: list[str] = []
    history: list[dict[str, Any]] = []
    for _ in range(20):
        d = run(pol=pol, kind="infer", knobs=knobs, capacity=16 * GiB, history=history)
        if d.give_up:
            break
        actions.append(d.action)
        history.append(d.to_dict())
        knobs = d.apply(knobs)
    assert actions[:4] == ["reduce_generation_batch", "reduce_generation_batch", "offload", "offload"]
    assert actions.count("offload") == 2  # max_times 2
    assert actions.index("reduce_max_pixels") < actions.index("reduce_max_new_tokens")
    assert actions.index("reduce_max_new_tokens") < actions.index("lower_precision")
    assert actions[-1] == "load_in_8bit"
    assert knobs["batch_size"] == 1
    assert knobs["precision"] == "fp16"
    assert knobs["max_pixels"] == 200704
    assert knobs["max_new_tokens"] == 64


def test_generation_batch_has_no_effective_batch_constraint() -> None:
    d = run(pol=policy("inference"), kind="infer", knobs=infer_knobs(batch_size=7))
    assert d.changes == {"batch_size": (7, 3)}
    predicted = run(
        pol=policy("inference"),
        kind="infer",
        knobs=infer_knobs(batch_size=32),
        points=[(2, 12 * GiB), (4, 14 * GiB)],
        capacity=21 * GiB,
    )
    assert predicted.changes == {"batch_size": (32, 10)}  # no divisor to keep: the fit itself


def test_offload_first_sets_budget_then_lowers_it() -> None:
    pol = policy("inference")
    knobs = infer_knobs(batch_size=1)
    first = run(pol=pol, kind="infer", knobs=knobs, capacity=16 * GiB)
    assert first.action == "offload"
    assert first.changes["device_map"] == (None, "auto")
    budget = first.changes["max_memory"][1]
    assert budget == {"0": "13926MiB"}  # 85 % of 16 GiB
    second = run(pol=pol, kind="infer", knobs=first.apply(knobs), capacity=16 * GiB)
    assert second.action == "offload"
    assert second.changes == {"max_memory": (budget, {"0": "11140MiB"})}


def test_an_inference_oom_lowers_the_gpu_memory_budget() -> None:
    knobs = infer_knobs(batch_size=1, max_memory={"0": "15GiB", "cpu": "30GiB"}, device_map="auto")
    d = run(pol=policy("inference"), kind="infer", knobs=knobs)
    assert d.changes == {"max_memory": (knobs["max_memory"], {"0": "12GiB", "cpu": "30GiB"})}


def test_offload_says_why_a_budget_cannot_be_lowered_or_set() -> None:
    only_offload = RetunePolicy.model_validate({"ladder": [{"action": "offload", "max_times": 5}]})

    def offload(kind: str = "infer", capacity: int | None = 16 * GiB, **knobs: Any) -> str:
        d = run(pol=only_offload, kind=kind, knobs=infer_knobs(batch_size=1, **knobs), capacity=capacity)
        assert d.give_up is not None
        return d.give_up.split(": ", 1)[1]

    assert (
        offload(max_memory={"0": "lots", "cpu": "30GiB"}, device_map="auto")
        == "offload: max_memory[0] = 'lots' is not a size"
    )
    assert (
        offload(max_memory={"0": "12GiB", "1": "1GiB"}, device_map="auto")
        == "offload: GPU budget 1GiB is at the minimum (1.00 GiB)"
    )
    assert offload(kind="command", max_memory="lots") == "offload: max_memory 'lots' is not a size"
    assert (
        offload(kind="command", max_memory="1GiB") == "offload: GPU budget 1GiB is at the minimum (1.00 GiB)"
    )
    assert offload(capacity=None) == "offload: the card's memory is unknown, so no GPU budget can be set"


def test_train_kind_has_no_offload_or_8bit() -> None:
    knobs = train_knobs(batch_size=1, gradient_checkpointing=True, precision="bf16")
    d = run(knobs=knobs)
    assert d.give_up is not None
    assert "load_in_8bit: the run has no load_in_8bit knob" in d.give_up


# ------------------------------------------------------------------------------ command runs


def test_command_run_uses_its_declared_knobs() -> None:
    knobs = {"batch_size": 16, "grad_accum_steps": 2}
    d = run(kind="command", knobs=knobs)
    assert d.changes == {"batch_size": (16, 8), "grad_accum_steps": (2, 4)}
    # A bare batch size without accumulation is not a training micro-batch: the generation rung
    # lowers it, with no learning rate involved.
    no_accum = run(kind="command", knobs={"batch_size": 16})
    assert no_accum.action == "reduce_generation_batch"
    assert no_accum.changes == {"batch_size": (16, 8)} and no_accum.lr_scale is None
    # Nor is it said to be one: the program may train, keeping its global batch itself or not.
    assert no_accum.reason.endswith(
        "batch 16 → 8 (no accumulation is named: a training run's effective batch changes with it, "
        "unless the program keeps it itself)"
    )
    assert run(kind="infer", knobs={"batch_size": 16}).reason.endswith("generation batch 16 → 8")
    at_one = run(kind="command", knobs={"batch_size": 1})
    assert at_one.give_up is not None
    assert "no grad_accum_steps knob, so the effective batch cannot be kept" in at_one.give_up


def test_command_training_without_accumulation_changes_effective_batch_only_if_allowed() -> None:
    pol = RetunePolicy.model_validate(
        {"ladder": [{"action": "reduce_micro_batch"}], "allow": ["effective_batch"]}
    )
    d = run(pol=pol, kind="command", knobs={"batch_size": 16})
    assert d.changes == {"batch_size": (16, 8)} and d.lr_scale == 0.5
    assert "learning rate scaled ×0.5" in d.reason


def test_command_run_generation_batch_with_inference_policy() -> None:
    d = run(pol=policy("inference"), kind="command", knobs={"batch_size": 16, "max_memory": "10GiB"})
    assert d.changes == {"batch_size": (16, 8)}
    d2 = run(pol=policy("inference"), kind="command", knobs={"batch_size": 1, "max_memory": "10GiB"})
    assert d2.changes == {"max_memory": ("10GiB", "8GiB")}


def test_decision_to_dict() -> None:
    d = run(knobs=train_knobs(batch_size=8))
    out = d.to_dict()
    assert out["changes"] == {"batch_size": [8, 4], "grad_accum_steps": [1, 2]}
    assert out["action"] == "reduce_micro_batch"
    assert out["give_up"] is None and out["rung"] == 5


def test_infer_kind_never_changes_accumulation() -> None:
    d = run(kind="infer", knobs=infer_knobs(batch_size=8))  # default policy on an infer run
    assert d.action == "reduce_generation_batch"
    assert d.changes == {"batch_size": (8, 4)}
    pol = policy(allow=["effective_batch"])
    at_one = run(pol=pol, kind="infer", knobs=infer_knobs(batch_size=1, precision="bf16", load_in_8bit=True))
    assert at_one.lr_scale is None


def test_decide_is_deterministic() -> None:
    kwargs: dict[str, Any] = {
        "knobs": train_knobs(batch_size=48, grad_accum_steps=3),
        "points": [(2, GiB), (8, 5 * GiB)],
    }
    assert run(**kwargs) == run(**kwargs)


def test_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown run kind 'serve'"):
        run(kind="serve")


def test_llm_fine_tuning_on_a_twelve_gb_card_end_to_end() -> None:
    """LLM fine-tuning on a 12 GB RTX 3060, batch 4 × accumulation 4."""
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total "
        "capacity of 11.76 GiB of which 612.00 MiB is free. Including non-PyTorch memory, this process "
        "has 11.10 GiB memory in use. Of the allocated memory 10.20 GiB is allocated by PyTorch, and "
        "520.00 MiB is reserved by PyTorch but unallocated."
    )
    c = classify_text(message)
    assert c.verdict == "gpu_capacity"
    knobs = train_knobs(batch_size=4, grad_accum_steps=4, max_length=2048)
    # Measured: 7 GiB at micro 1, 8.5 GiB at micro 2 → 5.5 GiB fixed + 1.5 GiB per sample.
    points = [(1, 7 * GiB), (2, 8 * GiB + 512 * (1 << 20))]
    d = run(c, knobs=knobs, points=points, capacity=12 * GiB)
    assert d.prediction is not None and d.prediction["batch"] == 3  # 11.76 × 0.92 = 10.82 GiB
    assert d.changes == {"batch_size": (4, 2), "grad_accum_steps": (4, 8)}
    # Another process holding the card is not the run's fault: wait, never shrink.
    busy = classify_text(message.replace("this process has 11.10 GiB", "this process has 3.10 GiB"))
    assert busy.verdict == "gpu_contention"
    assert run(busy, knobs=knobs).action == "wait_for_memory"


# -------------------------------------------------------------------------------- world size

CONTENTION = verdict("gpu_contention", device="cuda")


def _world(usable: int | None, **overrides: Any) -> RetuneDecision:
    pol = policy(ladder=[{"action": "reduce_world_size"}], **overrides)
    knobs = train_knobs(batch_size=4, grad_accum_steps=2, world_size=4)
    if usable is not None:
        knobs["usable_gpus"] = usable
    return run(CONTENTION, pol, knobs=knobs)


def test_a_gang_shrinks_to_the_usable_gpus_keeping_the_effective_batch_when_allowed() -> None:
    d = _world(3, allow=["world_size"])
    # 2 × 2 × 4 = 16: of 3 usable GPUs, 2 ranks divide accumulation × world size (8) evenly
    assert d.action == "reduce_world_size"
    assert d.changes == {"world_size": (4, 2), "grad_accum_steps": (2, 4)}
    assert effective_batch(d.apply(train_knobs(batch_size=4, grad_accum_steps=2, world_size=4))) == 32
    assert "effective batch 32 kept" in d.reason


def test_a_gang_keeps_its_size_without_consent_or_when_every_gpu_is_usable() -> None:
    assert "add world_size to `allow`" in str(_world(3).give_up)
    assert "enough for all 4 ranks" in str(_world(4, allow=["world_size"]).give_up)
    assert "not known" in str(_world(None, allow=["world_size"]).give_up)


IN_EVALUATION = verdict("gpu_capacity", device="cuda", phase="evaluation", frame="evaluation_loop")


def test_an_out_of_memory_in_evaluation_lowers_the_evaluation_batch() -> None:
    knobs = {"batch_size": 8, "grad_accum_steps": 1, "eval_batch_size": 64}
    d = run(IN_EVALUATION, kind="command", knobs=knobs)
    assert d.action == "reduce_eval_batch" and d.changes == {"eval_batch_size": (64, 32)}
    assert "it ran out in evaluation (evaluation_loop)" in d.reason and "training unchanged" in d.reason
    # In training, the evaluation batch is left as it is.
    assert run(CAPACITY, kind="command", knobs=knobs).action == "reduce_micro_batch"


def test_evaluation_without_its_own_batch_or_at_its_least_lowers_the_micro_batch() -> None:
    # A Lightning module validates with its data module's one batch size: the micro-batch.
    d = run(IN_EVALUATION, kind="command", knobs={"batch_size": 8, "grad_accum_steps": 1})
    assert d.action == "reduce_micro_batch"
    assert "(it ran out in evaluation (evaluation_loop); where evaluation has a batch of its own" in d.reason
    assert "name it with --role eval_batch=…" in d.reason
    d = run(
        IN_EVALUATION, kind="command", knobs={"batch_size": 8, "grad_accum_steps": 1, "eval_batch_size": 1}
    )
    assert d.action == "reduce_micro_batch"
