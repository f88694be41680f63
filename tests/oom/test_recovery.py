"""plan_recovery: from an out-of-memory attempt to the next attempt's spec, with probes."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.config.spec import RunSpec, parse_spec, spec_from_mapping
from gpuwarden.core.oom.recovery import AttemptFacts, ProbeTurn, plan_recovery

GB = 10**9
CPU_OOM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 4000000000 bytes. Error code 12 (Cannot allocate memory)"
)


def train_spec(batch: int, accum: int) -> RunSpec:
    return parse_spec(
        f"name: t\nkind: train\ntrain: {{task: image, batch_size: {batch}, grad_accum_steps: {accum}}}\n"
        "resources: {memory_limit: 6GB}\n"
    )


def oom_event(attempt: int, verdict: str = "host_oom", message: str = CPU_OOM) -> dict[str, Any]:
    return {"type": "oom", "attempt": attempt, "verdict": verdict, "message": message, "fields": {}}


class Machine:
    """peak(b) = 1 GB + 0.3 GB·b under a 6 GB limit: 16 fits (5.8 GB) only without headroom."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, b: int) -> tuple[int | None, bool]:
        self.calls.append(b)
        peak = int(1 * GB + 0.3 * GB * b)
        return (None, True) if peak > 6 * GB else (peak, False)


def test_host_oom_probes_then_jumps_to_the_predicted_fit_keeping_the_effective_batch() -> None:
    spec = train_spec(64, 1)
    m = Machine()
    facts = AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB)
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=m)
    assert plan.give_up is None, plan.give_up
    assert m.calls == [8, 16] or m.calls[:1] == [8]
    assert plan.classification.verdict == "host_oom"
    assert plan.spec is not None
    new = spec_from_mapping(plan.spec)
    assert new.train is not None
    # budget 6 GB × 0.92 = 5.52 GB → b ≤ 15.06; the largest divisor of 64 under that is 8
    assert new.train.batch_size == 8 and new.train.grad_accum_steps == 8
    assert new.train.effective_batch == 64
    assert plan.from_ == {"train.batch_size": 64, "train.grad_accum_steps": 1}
    assert plan.to == {"train.batch_size": 8, "train.grad_accum_steps": 8}
    assert plan.decision.prediction is not None and plan.decision.prediction["batch"] == 15
    assert [p["batch_size"] for p in plan.probes] == m.calls


def test_each_probe_is_announced_with_how_many_are_planned_now() -> None:
    def fits_under_8(b: int) -> tuple[int | None, bool]:
        return (None, True) if b >= 8 else (int(1 * GB + 0.3 * GB * b), False)

    turns: list[ProbeTurn] = []
    facts = AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB)
    plan_recovery(
        train_spec(64, 1),
        facts,
        history=[],
        retunes_so_far=0,
        elapsed_s=0,
        probe=fits_under_8,
        on_turn=turns.append,
    )
    # Two were planned; the first ran out of memory, so a third came: each with the accumulation
    # that keeps the effective batch of 64.
    assert turns == [ProbeTurn(1, 2, 8, 8), ProbeTurn(2, 3, 2, 32), ProbeTurn(3, 3, 4, 16)]


def test_progress_points_make_probes_unnecessary() -> None:
    spec = train_spec(32, 2)
    events = [
        {"type": "progress", "attempt": 1, "batch_size": 4, "mem_peak": 2 * GB, "step": 1, "samples_seen": 8},
        {
            "type": "progress",
            "attempt": 1,
            "batch_size": 8,
            "mem_peak": 3 * GB,
            "step": 2,
            "samples_seen": 16,
        },
        oom_event(2, verdict="gpu_capacity", message="CUDA out of memory. Tried to allocate 2.00 GiB."),
    ]
    m = Machine()
    facts = AttemptFacts(number=2, events=events, exit_code=3, gpu_capacity=12 * GB)
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=1, elapsed_s=10, probe=m)
    assert m.calls == []  # two batch sizes already measured
    assert plan.spec is not None
    t = spec_from_mapping(plan.spec).train
    assert t is not None and t.batch_size * t.grad_accum_steps == 64
    # 1 GB + 0.25 GB·b under 12 GB × 0.92 → b ≤ 40; largest divisor of 64 below 32 that fits: 16
    assert t.batch_size == 16


def test_command_run_classified_from_stderr_changes_its_templated_knob() -> None:
    spec = parse_spec(
        "name: c\nkind: command\ncommand: {argv: [python, infer.py, --batch, '{batch_size}']}\n"
        "knobs: {batch_size: 32}\n"
    )
    stderr = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 11.76 GiB of which 1.02 GiB is free."
    facts = AttemptFacts(number=1, events=[], stderr_tail=stderr, exit_code=1, gpu_capacity=12 * GB)
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=None)
    assert plan.classification.verdict == "gpu_capacity"
    assert plan.spec is not None and plan.spec["knobs"]["batch_size"] < 32
    assert plan.from_ == {"knobs.batch_size": 32}


def test_fragmentation_sets_the_allocator_first() -> None:
    spec = train_spec(16, 1)
    msg = (
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
        "0.80 GiB is free. Including non-PyTorch memory, this process has 22.80 GiB memory in use. Of the "
        "allocated memory 14.00 GiB is allocated by PyTorch, and 8.00 GiB is reserved by PyTorch but unallocated."
    )
    facts = AttemptFacts(
        number=1, events=[oom_event(1, "gpu_fragmentation", msg)], exit_code=3, gpu_capacity=24 * GB
    )
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=Machine())
    assert plan.classification.verdict == "gpu_fragmentation"
    assert plan.spec is not None and "expandable_segments:True" in plan.spec["env"]["PYTORCH_ALLOC_CONF"]
    assert plan.spec["train"]["batch_size"] == 16  # no shrinking for fragmentation
    assert plan.probes == []


def test_shape_bug_gives_up_with_the_reason() -> None:
    msg = "CUDA out of memory. Tried to allocate 7178.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 70.00 GiB is free."
    facts = AttemptFacts(number=1, events=[], stderr_tail=msg, exit_code=1, gpu_capacity=80 * GB)
    plan = plan_recovery(train_spec(8, 1), facts, history=[], retunes_so_far=0, elapsed_s=0, probe=Machine())
    assert plan.spec is None
    assert plan.give_up is not None and plan.give_up.startswith("shape_bug")


def command_spec(knobs: str, env: str = "{}") -> RunSpec:
    return parse_spec(
        "name: c\nkind: command\n"
        f"command: {{argv: [python, train.py, --bs, '{{batch_size}}'], env: {env}}}\nknobs: {knobs}\n"
    )


def test_a_command_run_with_accumulation_probes_the_divisors_that_keep_its_effective_batch() -> None:
    facts = AttemptFacts(number=1, events=[], stderr_tail=CPU_OOM, exit_code=1, host_capacity=6 * GB)
    probes = {}
    for knobs in ("{batch_size: 14, grad_accum_steps: 1}", "{batch_size: 14}"):
        m = Machine()
        plan_recovery(command_spec(knobs), facts, history=[], retunes_so_far=0, elapsed_s=0, probe=m)
        probes[knobs] = m.calls
    # First 14 // 8 = 1, then the largest the model says fits: with accumulation only a divisor of
    # 14 keeps the effective batch (7); without, any size below the OOM (12: 4.6 GB, 13 would not
    # keep 8 % of what the samples add).
    assert probes == {"{batch_size: 14, grad_accum_steps: 1}": [1, 7], "{batch_size: 14}": [1, 12]}


def test_a_command_runs_own_environment_counts_as_already_set() -> None:
    msg = (
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
        "0.80 GiB is free. Including non-PyTorch memory, this process has 22.80 GiB memory in use. Of the "
        "allocated memory 14.00 GiB is allocated by PyTorch, and 8.00 GiB is reserved by PyTorch but unallocated."
    )
    facts = AttemptFacts(number=1, events=[], stderr_tail=msg, exit_code=1, gpu_capacity=24 * GB)
    plain = plan_recovery(command_spec("{batch_size: 8}"), facts, history=[], retunes_so_far=0, elapsed_s=0)
    assert plain.decision.action == "allocator_expandable_segments"
    spec = command_spec("{batch_size: 8}", env="{PYTORCH_ALLOC_CONF: 'expandable_segments:True'}")
    already = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0)
    assert already.decision.action != "allocator_expandable_segments"


def test_the_largest_divisor_that_fits_is_probed_and_chosen() -> None:
    # The residual CNN of configs/examples/oom-recovery-cpu.yaml under 1.4 GiB, as measured (the
    # runner's worst vm_peak at b × 32/b): 16 × 2 ran with 6 % to spare, 32 × 1 ran out.
    measured = {1: 850_000_000, 2: 900_000_000, 4: 960_258_048, 8: 1_182_031_872, 16: 1_409_343_488}
    calls: list[int] = []

    def cnn(b: int) -> tuple[int | None, bool]:
        calls.append(b)
        return (measured[b], False) if b in measured else (None, True)

    limit = int(1.4 * (1 << 30))
    facts = AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=limit)
    plan = plan_recovery(train_spec(32, 1), facts, history=[], retunes_so_far=0, elapsed_s=0, probe=cnn)
    # One point well under the OOM, then the largest the model says fits, measured: two probes.
    assert calls == [4, 16]
    assert plan.to == {"train.batch_size": 16, "train.grad_accum_steps": 2}
    assert plan.decision.prediction is not None and plan.decision.prediction["batch"] >= 16


def test_a_probe_that_runs_out_of_memory_bounds_the_next() -> None:
    m = Machine()  # 1 GB + 0.3 GB·b under 6 GB: 16 is the largest that runs
    facts = AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB)
    plan = plan_recovery(train_spec(64, 1), facts, history=[], retunes_so_far=0, elapsed_s=0, probe=m)
    # 8, then 32 (the line through 8 and the OOM at 64 over-estimates), which runs out; then 16.
    assert m.calls == [8, 32, 16]
    assert [p["oom"] for p in plan.probes] == [False, True, False]
    # 16 runs with 3 % to spare, less than 8 % of the 4.8 GB its samples add: 8 × 8.
    assert plan.to == {"train.batch_size": 8, "train.grad_accum_steps": 8}
    assert plan.decision.prediction is not None and plan.decision.prediction["batch"] == 15


def test_the_evidence_says_which_way_it_was_decided() -> None:
    spec = train_spec(32, 2)
    steps = [
        {"type": "progress", "attempt": 1, "batch_size": b, "mem_peak": int(GB + 0.25 * GB * b), "step": s}
        for s, b in ((1, 4), (2, 8))
    ]
    oom = oom_event(2, verdict="gpu_capacity", message="CUDA out of memory. Tried to allocate 2.00 GiB.")
    facts = AttemptFacts(number=2, events=[*steps, oom], exit_code=3, gpu_capacity=12 * GB)
    m = Machine()
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=1, elapsed_s=10, probe=m)
    assert m.calls == [] and plan.evidence()["decided"] == "decided from 2 measured steps, no probe"

    probed = plan_recovery(
        train_spec(64, 1),
        AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB),
        history=[],
        retunes_so_far=0,
        elapsed_s=0,
        probe=Machine(),
    )
    assert probed.evidence()["decided"] == "3 probe processes, 3 sizes"


def test_sizes_remembered_from_a_run_of_the_same_shape_make_probes_unnecessary() -> None:
    m = Machine()
    facts = AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB)
    remembered = [(8, int(3.4 * GB)), (16, int(5.8 * GB))]
    plan = plan_recovery(
        train_spec(64, 1), facts, history=[], retunes_so_far=0, elapsed_s=0, probe=m, remembered=remembered
    )
    assert m.calls == []
    assert plan.to == {"train.batch_size": 8, "train.grad_accum_steps": 8}
    assert (
        plan.evidence()["decided"] == "decided from 2 sizes remembered from a run of the same shape, no probe"
    )


def test_sizes_measured_in_one_probe_process_are_counted_as_one() -> None:
    m = Machine()
    probed = plan_recovery(
        train_spec(64, 1),
        AttemptFacts(number=1, events=[oom_event(1)], exit_code=3, host_capacity=6 * GB),
        history=[],
        retunes_so_far=0,
        elapsed_s=0,
        probe=m,
        probe_processes=lambda: 1,
    )
    assert len(m.calls) == 3 and probed.evidence()["decided"] == "1 probe process, 3 sizes"


def fixed_event(attempt: int, fixed: int, device: str = "cpu") -> dict[str, Any]:
    return {"type": "fixed_memory", "attempt": attempt, "fixed_bytes": fixed, "device": device}


def test_weights_gradients_and_state_over_the_limit_end_the_retune_without_a_probe() -> None:
    """A model whose fixed memory alone exceeds the limit: halving the micro-batch down to 1
    would fail at every size; the retune says why at once and starts no probe."""
    spec = train_spec(64, 1)
    m = Machine()
    events = [fixed_event(1, 7 * GB), oom_event(1)]
    facts = AttemptFacts(number=1, events=events, exit_code=3, host_capacity=6 * GB)
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=m)
    assert m.calls == []
    assert plan.give_up is not None
    assert plan.give_up == (
        "not retuned: the weights, gradients and optimizer state alone take at least 6.5 GiB of the "
        "5.6 GiB that ran out, so no smaller batch or input fits — give the run more memory or train "
        "a smaller model"
    )
    assert plan.decided == "decided from the fixed memory the run reported, no probe"
    assert plan.decision.prediction is not None and plan.decision.prediction["batch"] == 0


def test_the_fixed_memory_leaves_the_rungs_that_may_shrink_it() -> None:
    """A script's own precision knob may cast the weights (the built-in trainer's is autocast and
    does not): the retune takes it rather than a smaller micro-batch."""
    spec = command_spec("{batch_size: 64, grad_accum_steps: 1, precision: fp32}")
    events = [fixed_event(1, 7 * GB, "cuda"), oom_event(1, "gpu_capacity", "CUDA out of memory.")]
    facts = AttemptFacts(number=1, events=events, exit_code=3, gpu_capacity=6 * GB)
    plan = plan_recovery(
        spec, facts, history=[], retunes_so_far=0, elapsed_s=0, hints={"bf16_supported": True}
    )
    assert plan.give_up is None, plan.give_up
    assert plan.decision.action == "lower_precision"


def test_a_fixed_memory_of_another_attempt_or_memory_is_not_taken() -> None:
    """Only the attempt that ran out, in the memory that ran out: a GPU figure says nothing of
    the host's address space, and the next attempt may hold less."""
    spec = train_spec(64, 1)
    for stale in (fixed_event(1, 7 * GB, "cuda"), fixed_event(0, 7 * GB)):
        facts = AttemptFacts(number=1, events=[stale, oom_event(1)], exit_code=3, host_capacity=6 * GB)
        plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=Machine())
        assert plan.give_up is None, plan.give_up
        assert plan.decision.action == "reduce_micro_batch"


def test_the_address_space_says_nothing_of_a_host_without_a_limit() -> None:
    """Without an address-space limit a host runs out of resident memory, which the address
    space held (reserved, never touched) does not bound: the figure is not taken there."""
    spec = parse_spec("name: t\nkind: train\ntrain: {task: image, batch_size: 64, grad_accum_steps: 1}\n")
    facts = AttemptFacts(
        number=1, events=[fixed_event(1, 7 * GB), oom_event(1)], exit_code=3, host_capacity=6 * GB
    )
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0, probe=Machine())
    assert plan.give_up is None, plan.give_up
    assert plan.decision.action == "reduce_micro_batch"


def test_a_fixed_memory_under_the_limit_tightens_a_one_point_fit() -> None:
    """One measured step at 16 (3.4 GB) under a 6 GB limit: assumed proportional, 26 fit; with
    2.5 GB known to be fixed the line is 2.5 + 0.056·b and 54 fit, still on the safe side of the
    real machine's 1 + 0.3·b (which has a larger intercept than 0)."""
    from gpuwarden.core.oom.memory_model import predict_max_batch

    plain = predict_max_batch([(16, int(3.4 * GB))], 6 * GB)
    known = predict_max_batch([(16, int(3.4 * GB))], 6 * GB, fixed_at_least=int(2.5 * GB))
    assert plain.batch == 26
    assert known.batch == 57
    assert known.fixed == 2.5 * GB and "above the fixed memory reported" in known.basis
