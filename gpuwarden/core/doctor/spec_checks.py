"""Static checks of a run spec against a target device (the slow-training
checklist: precision, compile, batch, syncs, fused optimiser, data loading).

Each check returns findings with the spec key and file:line as evidence and, where editing the
spec fixes it, the edit. Advice that only speeds up GPUs is at most `info` (with the fix in words)
when the target is the CPU, so `--fix` never rewrites a CPU spec for hardware it will not run on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.doctor.finding import Finding, Severity
from gpuwarden.core.doctor.spec_view import SpecView
from gpuwarden.core.doctor.target import Target
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.profiles import profile_for

# Expected gains as reported for one small CAPTCHA CNN on an RTX 5090, quoted as "typically".
GAIN_PRECISION = "typically +20–40 % samples/s"
GAIN_COMPILE = "typically +10–30 % samples/s after a start-up compile of tens of seconds"
GAIN_BATCH = "typically +30–50 % samples/s for a 2–4× larger batch"
GAIN_SYNC = "typically +5–10 % samples/s"
GAIN_FUSED = "typically +3–5 % samples/s"
GAIN_WORKERS = (
    "reported for an image-restoration CNN: utilisation 20 % → 80–85 % together with batch and"
    " precision fixes"
)
# A micro-batch at or below this share of the tier's starting batch is "tiny".
TINY_BATCH_SHARE = 0.25
# On a CPU target (no memory tier), training micro-batches below this are flagged, and raised to
# CPU_BATCH (docs/doctor.md measures the small CNN example before and after).
CPU_MIN_BATCH = 8
CPU_BATCH = 16
# Progress events every N steps when the spec asked for every step (the runner's default).
LOG_INTERVAL_FIX = 10
DEPRECATED_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_ENV = "PYTORCH_ALLOC_CONF"

Check = Callable[[SpecView, Target], list[Finding]]


def _gpu_or_info(target: Target, severity: Severity) -> Severity:
    return severity if target.gpu else "info"


def _mixed_precision_kind(target: Target) -> str:
    if target.bf16 is True:
        return "bf16"
    if target.bf16 is False:
        return "fp16 (this GPU has no bf16)"
    return "bf16 or fp16"


# -- train ----------------------------------------------------------------------------------------


def check_train_precision(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.resolved_precision_request() == "fp32":
        path = ("train", "amp") if train.amp is False else ("train", "precision")
        value = train.amp if train.amp is False else train.precision
        evidence = view.evidence(path, value, mixed_precision_here=_mixed_precision_kind(target))
        if not target.gpu:
            evidence["mixed_precision_here"] = None
            return [
                Finding(
                    "precision-fp32",
                    "info",
                    "fp32 compute: on a GPU this would leave mixed precision off",
                    evidence,
                    "on a GPU set train.precision: auto (bf16 where supported); on this CPU fp32 is "
                    "what auto picks anyway",
                    GAIN_PRECISION + " on a GPU",
                )
            ]
        fix: dict[str, Any] = {"train.precision": "auto"}
        if train.amp is not None:
            fix["train.amp"] = None
        return [
            Finding(
                "precision-fp32",
                "warning",
                "mixed precision is off: the run computes in fp32",
                evidence,
                fix,
                GAIN_PRECISION,
            )
        ]
    if train.amp is True:
        # A common training script compared the YAML value with 'bf16' and silently ran fp32; gpuwarden
        # reads `amp: true` as mixed precision, so this is only a note to write it plainly.
        return [
            Finding(
                "precision-amp-legacy",
                "info",
                "`amp: true` is read as mixed precision (bf16 where supported, else fp16)",
                view.evidence(("train", "amp"), True, precision=train.precision),
                {"train.amp": None, "train.precision": "auto"},
                None,
            )
        ]
    return []


def check_train_compile(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.compile:
        return []
    evidence = view.evidence(("train", "compile"), False)
    if not target.gpu:
        return [
            Finding(
                "compile-off",
                "info",
                "torch.compile is off",
                evidence,
                "on a GPU set train.compile: true; on a CPU with few cores the compile time rarely pays "
                "for itself in a short run",
                GAIN_COMPILE + " on a GPU",
            )
        ]
    severity: Severity = "warning" if view.explicit(("train", "compile")) else "info"
    return [
        Finding(
            "compile-off", severity, "torch.compile is off", evidence, {"train.compile": True}, GAIN_COMPILE
        )
    ]


def check_train_tf32(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.tf32:
        return []
    evidence = view.evidence(("train", "tf32"), False)
    if not target.gpu or target.bf16 is False:
        return [
            Finding(
                "tf32-off",
                "info",
                "TF32 is off",
                evidence,
                "TF32 exists only on CUDA GPUs from Ampere on; set train.tf32: true for those",
                None,
            )
        ]
    fp32 = train.resolved_precision_request() == "fp32"
    return [
        Finding(
            "tf32-off",
            "warning" if fp32 else "info",
            "TF32 is off: fp32 matmuls and convolutions run at full fp32 cost",
            evidence,
            {"train.tf32": True},
            "fp32 matmuls several times faster on Ampere+ tensor cores" if fp32 else None,
        )
    ]


def check_train_log_interval(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.log_interval != 1:
        return []
    evidence = view.evidence(("train", "log_interval"), 1)
    fix = {"train.log_interval": LOG_INTERVAL_FIX}
    if not target.gpu:
        return [
            Finding(
                "sync-every-step",
                "info",
                "a progress event after every step",
                evidence,
                fix,
                "small on a CPU (no device to wait for; each event costs a memory probe and a write)",
            )
        ]
    return [
        Finding(
            "sync-every-step",
            "warning",
            "a host–device sync every step (log_interval: 1 reads the loss with .item())",
            evidence,
            fix,
            GAIN_SYNC,
        )
    ]


def check_train_fused(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.optimizer.fused is not False:
        return []
    evidence = view.evidence(("train", "optimizer", "fused"), False)
    return [
        Finding(
            "optimizer-unfused",
            _gpu_or_info(target, "warning"),
            "AdamW without the fused kernel",
            evidence,
            {"train.optimizer.fused": "auto"},
            GAIN_FUSED if target.gpu else "small on a CPU (a fused CPU AdamW exists in recent torch)",
        )
    ]


def _workers_used(train: TrainSpec, target: Target) -> int:
    """What the runner will use: `auto` is min(4, cores − 1) on a GPU and 0 on the CPU."""
    if train.num_workers == "auto":
        return max(0, min(4, target.cores - 1)) if target.gpu else 0
    return train.num_workers


def check_train_workers(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    findings: list[Finding] = []
    workers = train.num_workers
    if workers == 0:
        findings.append(_main_process_loading(view, target))
    elif isinstance(workers, int) and workers > target.cores:
        findings.append(
            Finding(
                "workers-oversubscribed",
                "warning",
                f"{workers} data workers for {target.cores} core(s): they fight each other and the "
                "training process for CPU time",
                view.evidence(("train", "num_workers"), workers, cores=target.cores),
                {"train.num_workers": "auto"},
                None,
            )
        )
    if not train.persistent_workers and _workers_used(train, target) > 0:
        findings.append(
            Finding(
                "workers-not-persistent",
                "info",
                "data workers are restarted every epoch",
                view.evidence(
                    ("train", "persistent_workers"), False, num_workers=_workers_used(train, target)
                ),
                {"train.persistent_workers": True},
                "saves the worker start-up (seconds for large datasets) at each epoch",
            )
        )
    return findings


def _main_process_loading(view: SpecView, target: Target) -> Finding:
    """num_workers: 0 — a warning on a GPU machine with cores to spare, else why it is right."""
    evidence = view.evidence(("train", "num_workers"), 0, cores=target.cores)
    if target.gpu and target.cores > 1:
        return Finding(
            "data-loading-main-process",
            "warning",
            "num_workers: 0 — data loading runs on the training process, between GPU steps",
            evidence,
            {"train.num_workers": "auto"},
            GAIN_WORKERS,
        )
    why = (
        "the runner loads data in the training process on the CPU on purpose: workers would "
        f"compete with the compute threads for the {target.cores} core(s)"
        if not target.gpu
        else "this machine has one core: workers would only add overhead"
    )
    return Finding(
        "data-loading-main-process",
        "info",
        "num_workers: 0 — data loading runs on the training process",
        evidence,
        f"{why}; on a GPU machine with spare cores use num_workers: auto",
        None,
    )


def check_train_pin_memory(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.pin_memory is not False:
        return []
    evidence = view.evidence(("train", "pin_memory"), False)
    if not target.gpu:
        return [
            Finding(
                "pin-memory-off",
                "info",
                "pin_memory: false",
                evidence,
                "pinned memory only matters for host-to-GPU copies; on a GPU use pin_memory: auto",
                None,
            )
        ]
    return [
        Finding(
            "pin-memory-off",
            "warning",
            "pin_memory: false — host-to-GPU copies cannot overlap compute",
            evidence,
            {"train.pin_memory": "auto"},
            None,
        )
    ]


def check_train_image_layout(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    if train.task != "image":
        return []
    findings: list[Finding] = []
    if not train.cudnn_benchmark:
        evidence = view.evidence(("train", "cudnn_benchmark"), False)
        fix: dict[str, Any] | str = (
            {"train.cudnn_benchmark": True}
            if target.gpu
            else "cuDNN autotuning is CUDA only; on a GPU set train.cudnn_benchmark: true"
        )
        findings.append(
            Finding(
                "cudnn-benchmark-off",
                _gpu_or_info(target, "warning"),
                "cuDNN autotuning is off: convolutions use the default algorithm",
                evidence,
                fix,
                "often +5–20 % for fixed-size convolutions" if target.gpu else None,
            )
        )
    if not train.channels_last:
        evidence = view.evidence(("train", "channels_last"), False)
        fix = (
            {"train.channels_last": True}
            if target.gpu
            else (
                "on a GPU set train.channels_last: true (tensor cores want NHWC); on the CPU it "
                "measured slower for the example in docs/doctor.md"
            )
        )
        findings.append(
            Finding(
                "channels-last-off",
                _gpu_or_info(target, "warning"),
                "channels_last is off: convolutions under mixed precision want NHWC tensors",
                evidence,
                fix,
                "often +10–30 % for convolution nets under mixed precision" if target.gpu else None,
            )
        )
    return findings


def _tier_batch(kind: str, task: str, target: Target) -> tuple[int, str] | None:
    assert target.memory_total is not None
    try:
        profile = profile_for(target.memory_total, kind, task)
    except UserError:
        return None
    batch = profile.get("batch_size")
    return (int(batch), str(profile["tier"])) if isinstance(batch, int) else None


def micro_batch_finding(
    view: SpecView, target: Target, section: str, batch: int, accum: int, kind: str, task: str
) -> list[Finding]:
    """A micro-batch at a quarter or less of the memory tier's starting point (on the CPU: below
    CPU_MIN_BATCH, where each step's fixed cost — optimizer, Python, events — dominates)."""
    severity: Severity = "warning"
    if target.memory_total is not None:
        found = _tier_batch(kind, task, target)
        if found is None:
            return []
        tier_batch, tier = found
        limit = tier_batch * TINY_BATCH_SHARE
        title = f"micro-batch {batch} is tiny for a {tier} GPU (its starting point is {tier_batch})"
    elif not target.gpu and kind == "train":
        tier_batch, tier, severity = CPU_BATCH, "CPU", "info"
        limit = CPU_MIN_BATCH - 1
        title = f"micro-batch {batch} is tiny: each step's fixed cost dominates, even on the CPU"
    else:
        return []
    if batch > limit:
        return []
    per_step = batch * accum
    if accum > 1 and per_step > limit:
        # Keep the effective batch: trade gradient accumulation for a bigger micro-batch.
        new_batch = min(tier_batch, per_step)
        fix: dict[str, Any] = {
            f"{section}.batch_size": new_batch,
            f"{section}.grad_accum_steps": max(1, per_step // new_batch),
        }
        note = "gradient accumulation shrinks to keep the effective batch"
    else:
        fix = {f"{section}.batch_size": tier_batch}
        if accum > 1:
            fix[f"{section}.grad_accum_steps"] = 1
        note = "the effective batch grows with it: retune the learning rate if needed"
    return [
        Finding(
            "micro-batch-small",
            severity,
            title,
            view.evidence(
                (section, "batch_size"),
                batch,
                tier=tier,
                tier_batch_size=tier_batch,
                memory_total=target.memory_total,
                note=note,
            ),
            fix,
            GAIN_BATCH
            if target.gpu
            else "the CPU example in docs/doctor.md ran 1.2–2.6× the samples/s with its --fix spec",
        )
    ]


def check_train_batch(view: SpecView, target: Target) -> list[Finding]:
    train = view.spec.train
    assert train is not None
    return micro_batch_finding(
        view, target, "train", train.batch_size, train.grad_accum_steps, "train", train.task
    )


# -- infer ----------------------------------------------------------------------------------------


def check_infer(view: SpecView, target: Target) -> list[Finding]:
    infer: InferSpec | None = view.spec.infer
    assert infer is not None
    findings: list[Finding] = []
    if infer.precision == "fp32" and target.gpu:
        findings.append(
            Finding(
                "precision-fp32",
                "warning",
                "inference in fp32: half the memory and about twice the speed are left unused",
                view.evidence(
                    ("infer", "precision"), "fp32", mixed_precision_here=_mixed_precision_kind(target)
                ),
                {"infer.precision": "auto"},
                "about 2× items/s and half the weight memory (measured for a document-parsing"
                " vision-language model on a 16 GB card)",
            )
        )
    if not infer.compile and target.gpu and view.explicit(("infer", "compile")):
        findings.append(
            Finding(
                "compile-off",
                "info",
                "torch.compile is off",
                view.evidence(("infer", "compile"), False),
                {"infer.compile": True},
                "pays off for long batched generation with a static KV cache",
            )
        )
    findings += micro_batch_finding(view, target, "infer", infer.batch_size, 1, "infer", infer.task)
    return findings


# -- any kind -------------------------------------------------------------------------------------


def check_allocator_env(view: SpecView, target: Target) -> list[Finding]:
    """`PYTORCH_CUDA_ALLOC_CONF` is the deprecated name; torch reads `PYTORCH_ALLOC_CONF` first."""
    findings: list[Finding] = []
    envs: list[tuple[tuple[str, ...], dict[str, str]]] = [(("env",), view.spec.env)]
    if view.spec.command is not None:
        envs.append((("command", "env"), view.spec.command.env))
    for prefix, env in envs:
        if DEPRECATED_ALLOC_ENV not in env:
            continue
        value = env[DEPRECATED_ALLOC_ENV]
        base = ".".join(prefix)
        fix: dict[str, Any] = {f"{base}.{DEPRECATED_ALLOC_ENV}": None}
        if ALLOC_ENV not in env:
            fix[f"{base}.{ALLOC_ENV}"] = value
        findings.append(
            Finding(
                "alloc-conf-deprecated",
                "warning",
                f"{DEPRECATED_ALLOC_ENV} is the deprecated name of {ALLOC_ENV}",
                view.evidence((*prefix, DEPRECATED_ALLOC_ENV), value, both_set=ALLOC_ENV in env),
                fix,
                None,
            )
        )
    return findings


TRAIN_CHECKS: tuple[Check, ...] = (
    check_train_precision,
    check_train_compile,
    check_train_tf32,
    check_train_log_interval,
    check_train_fused,
    check_train_workers,
    check_train_pin_memory,
    check_train_image_layout,
    check_train_batch,
)


def check_spec(view: SpecView, target: Target) -> tuple[list[Finding], list[str]]:
    """Every static finding for the spec on `target`, and notes about checks that were skipped."""
    findings: list[Finding] = []
    notes: list[str] = []
    if view.spec.train is not None:
        for check in TRAIN_CHECKS:
            findings += check(view, target)
    if view.spec.infer is not None:
        findings += check_infer(view, target)
    findings += check_allocator_env(view, target)
    if view.spec.kind in ("train", "infer") and target.memory_total is None:
        notes.append(
            "micro-batch against a GPU memory tier: skipped — no GPU here; pass --gpu-memory "
            "(e.g. 24GiB) for a GPU's advice"
        )
    return findings, notes
