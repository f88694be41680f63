"""A retune record read as one sentence (the dashboard and `gpuwarden show` print it)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.api import Retune
from gpuwarden.core.oom.explain import retune_sentence, where_text

# The record the daemon stored for the CPU example that runs out of memory for real.
HOST_OOM: dict[str, Any] = {
    "id": 1, "run_id": "r6fd6d23865", "attempt": 1, "ts": 1.0, "verdict": "host_oom",
    "outcome": "succeeded",
    "from": {"train.batch_size": 64, "train.grad_accum_steps": 1},
    "to": {"train.batch_size": 16, "train.grad_accum_steps": 4},
    "evidence": {
        "message": "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "134217728 bytes. Error code 12 (Cannot allocate memory)",
        "reason": "host allocator could not allocate 128.00 MiB: host memory exhausted",
        "fields": {"source": "cpu_allocator", "device": "cpu", "requested": 134217728},
        "decision": {
            "action": "reduce_micro_batch",
            "changes": {"batch_size": [64, 16], "grad_accum_steps": [1, 4]},
            "env": {}, "lr_scale": None, "reason": "…", "give_up": None, "wait_s": None, "rung": 3,
            "prediction": {"batch": 24, "fixed": 989601792.0, "per_sample": 23710208.0,
                           "capacity": 1717986918, "headroom": 0.08, "basis": "least-squares fit"},
        },
        "probes": [{"batch_size": 8, "peak": 1179283456, "oom": False}],
    },
    "prediction": {"batch": 24, "fixed": 989601792.0, "per_sample": 23710208.0, "capacity": 1717986918,
                   "headroom": 0.08, "basis": "least-squares fit"},
}  # fmt: skip


def test_a_host_oom_retune_reads_as_one_sentence() -> None:
    assert retune_sentence(Retune.model_validate(HOST_OOM), "forward") == (
        "out of memory in forward (host: tried 128 MiB, limit 1.6 GiB) → micro-batch 64 → 16, "
        "accumulation 1 → 4, effective batch 64 kept; memory model: 24 fits with 9 % to spare; 16 "
        "chosen, the largest that divides 64"
    )


def test_a_gpu_retune_without_a_model_says_what_changed() -> None:
    record = {
        "id": 2, "run_id": "r1", "attempt": 2, "ts": 1.0, "verdict": "gpu_fragmentation", "outcome": None,
        "from": {}, "to": {},
        "evidence": {
            "fields": {"requested": 2 * 1024**3, "total": 24 * 1024**3, "free": 1024**3},
            "decision": {"action": "allocator_expandable_segments", "changes": {},
                         "env": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}},
        },
        "prediction": None,
    }  # fmt: skip
    assert retune_sentence(Retune.model_validate(record)) == (
        "out of memory (GPU, fragmented: tried 2.0 GiB, limit 24 GiB, 1.0 GiB free) → "
        "PYTORCH_ALLOC_CONF=expandable_segments:True"
    )


def test_a_record_without_evidence_still_reads() -> None:
    record = {
        "id": 3, "run_id": "r1", "attempt": 1, "ts": 1.0, "verdict": "gpu_capacity", "outcome": None,
        "from": {"train.precision": "fp32"}, "to": {"train.precision": "bf16"},
        "evidence": None, "prediction": None,
    }  # fmt: skip
    assert retune_sentence(Retune.model_validate(record)) == "out of memory (GPU) → precision fp32 → bf16"


@pytest.mark.parametrize(
    ("limit", "shown"), [(2.92, "limit 2.92 GiB"), (2.923, "limit 2.923 GiB"), (1.35, "limit 1.35 GiB")]
)
def test_a_limit_reads_as_it_was_written(limit: float, shown: str) -> None:
    retune = Retune.model_validate(
        {**HOST_OOM, "prediction": {**HOST_OOM["prediction"], "capacity": round(limit * 1024**3)}}
    )
    assert shown in where_text(retune)


def test_the_model_names_the_largest_that_fits_against_the_one_chosen() -> None:
    # The residual CNN under 1.4 GiB: probes at 4 and 16 (measured peaks), 32 ran out.
    prediction = {
        "batch": 17,
        "fixed": 810_619_563.0,
        "per_sample": 37_420_245.0,
        "capacity": 1503238553,
        "headroom": 0.08,
        "basis": "least-squares fit over 2 batch sizes",
    }
    record = {**HOST_OOM, "prediction": prediction,
              "from": {"train.batch_size": 32, "train.grad_accum_steps": 1},
              "to": {"train.batch_size": 16, "train.grad_accum_steps": 2},
              "evidence": {**HOST_OOM["evidence"], "decision": {
                  **HOST_OOM["evidence"]["decision"], "prediction": prediction,
                  "changes": {"batch_size": [32, 16], "grad_accum_steps": [1, 2]}}}}  # fmt: skip
    text = retune_sentence(Retune.model_validate(record))
    assert text.endswith("memory model: 17 fits with 4 % to spare; 16 chosen, the largest that divides 32")
    exact = {**record, "prediction": {**prediction, "batch": 16}}
    exact["evidence"] = {
        **record["evidence"],
        "decision": {**record["evidence"]["decision"], "prediction": exact["prediction"]},
    }
    assert retune_sentence(Retune.model_validate(exact)).endswith(
        "memory model: 16 fits with 6 % to spare; 16 chosen"
    )


def test_the_sentence_says_which_way_it_was_decided() -> None:
    record = {**HOST_OOM, "evidence": {**HOST_OOM["evidence"], "decided": "2 probe processes, 2 sizes"}}
    assert retune_sentence(Retune.model_validate(record)).endswith(
        "16 chosen, the largest that divides 64 (2 probe processes, 2 sizes)"
    )


def test_a_retune_decided_without_memory_figures_reads_with_one_aside() -> None:
    blind = {"batch": None, "basis": "no measured peaks", "capacity": 1363148800, "headroom": 0.08}
    decided = "decided without memory figures, no probe: the restart measures its size itself"
    record = {
        **HOST_OOM,
        "prediction": blind,
        "evidence": {**HOST_OOM["evidence"], "decided": decided, "decision": {"prediction": blind}},
    }
    assert retune_sentence(Retune.model_validate(record)).endswith(
        "; memory model: no fit yet, no measured peaks (decided without memory figures, no probe: the"
        " restart measures its size itself)"
    )
