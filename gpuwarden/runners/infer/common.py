"""What both inference tasks share: model loading (precision, attention, offload, 8-bit), the
run context, progress events and turning an out-of-memory failure into an `oom` event.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM, Oom, Progress, Warning, decode
from gpuwarden.runners.device import (
    PrecisionChoice,
    device_name,
    memory_stats,
    resolve_precision,
    select_device,
    synchronize,
)
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.infer.report import EnergyMeter, InferReport

# Tried in this order when the requested attention kernel cannot be used with a model.
ATTN_FALLBACKS = ("sdpa", "eager")

EIGHT_BIT_NEEDS_CUDA = "load_in_8bit needs CUDA and bitsandbytes — remove it or run on a GPU"


def quiet_transformers() -> None:
    """Progress bars would fill stderr.log with carriage returns; real warnings still go through."""
    import transformers.utils.logging

    # transformers' logging helpers carry no annotations; go through Any rather than ignores.
    hf_logging: Any = transformers.utils.logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_warning()
    logging.getLogger("accelerate").setLevel(logging.WARNING)


@dataclass
class InferContext:
    """Everything a task body needs about the attempt it runs in."""

    spec: RunSpec
    infer: InferSpec
    run_dir: Path
    attempt: int
    events: EventWriter
    device: torch.device
    precision: PrecisionChoice
    report: InferReport
    energy: EnergyMeter
    step: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0

    @property
    def device_label(self) -> str:
        return device_name(self.device)

    def warn(self, code: str, message: str, requested: Any = None, used: Any = None) -> None:
        self.events.emit(Warning(code=code, message=message, requested=requested, used=used))

    def progress(self, batch_size: int) -> None:
        """One `progress` event after a batch: items done (all attempts), rates and memory."""
        items_per_s, tokens_per_s = self.report.rates()
        mem = memory_stats(self.device)
        self.report.peak_memory_bytes = max(self.report.peak_memory_bytes or 0, mem.peak or 0) or None
        self.events.emit(
            Progress(
                step=self.step,
                samples_seen=self.samples_seen,
                tokens_seen=self.tokens_seen,
                samples_per_s=round(items_per_s, 4) if items_per_s is not None else None,
                tokens_per_s=round(tokens_per_s, 2) if tokens_per_s is not None else None,
                batch_size=batch_size,
                total=self.report.items_total,
                **mem.as_progress(),
            )
        )

    def finish_report(self) -> dict[str, Any]:
        """Fill in peak memory and energy, write report.json, return the report."""
        mem = memory_stats(self.device)
        self.report.peak_memory_bytes = max(self.report.peak_memory_bytes or 0, mem.peak or 0) or None
        self.report.energy_j = self.energy.joules()
        return self.report.write(self.run_dir)


def make_context(
    spec: RunSpec, run_dir: Path, attempt: int, events: EventWriter, output: Path
) -> InferContext:
    """Pick the device and precision and start the report; raises UserError for impossible specs."""
    assert spec.infer is not None
    infer = spec.infer
    device = select_device(spec.resources.gpus, spec.resources.allow_cpu)
    precision = resolve_precision(infer.precision, device)
    report = InferReport(
        task=infer.task,
        attempt=attempt,
        device=device_name(device),
        dtype=precision.used,
        batch_size=infer.batch_size,
        output=str(output),
    )
    return InferContext(
        spec=spec,
        infer=infer,
        run_dir=run_dir,
        attempt=attempt,
        events=events,
        device=device,
        precision=precision,
        report=report,
        energy=EnergyMeter(device.type),
        step=steps_before(run_dir, attempt),
    )


def steps_before(run_dir: Path, attempt: int) -> int:
    """The last `step` earlier attempts of this run reported: batches count on from there, as a
    training run's steps do across attempts."""
    last = 0
    for earlier in range(1, attempt):
        try:
            # A line at a time: a long run's events do not all come into memory at once.
            with (run_dir / "attempts" / str(earlier) / "events.jsonl").open(errors="replace") as lines:
                for event in filter(None, map(decode, lines)):
                    step = event.get("step")
                    if event["type"] == "progress" and isinstance(step, int) and not isinstance(step, bool):
                        last = max(last, step)
        except OSError:
            continue
    return last


def warn_precision(ctx: InferContext) -> None:
    """Say when the precision used differs from the one asked for (auto → fp32 on a CPU is silent)."""
    choice = ctx.precision
    if choice.warning is None:
        return
    # The shared resolver words its auto → fp16 note for training (loss scaling); say it plainly.
    message = (
        f"this GPU has no native bf16; using {choice.used}" if choice.requested == "auto" else choice.warning
    )
    ctx.warn("precision_unavailable", message, requested=choice.requested, used=choice.used)


def check_eight_bit(infer: InferSpec, device: torch.device) -> None:
    """8-bit weights need bitsandbytes' CUDA kernels; refuse early instead of failing mid-load."""
    if not infer.load_in_8bit:
        return
    if device.type != "cuda":
        raise UserError(f"{EIGHT_BIT_NEEDS_CUDA} (this run is on the CPU)", code="unsupported")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            f"{EIGHT_BIT_NEEDS_CUDA} (bitsandbytes is not installed: pip install bitsandbytes)",
            code="unsupported",
        )


def _max_memory(ctx: InferContext) -> dict[int | str, str] | None:
    """The spec's budget in accelerate's form (GPU keys as ints); GPU keys dropped on a CPU run."""
    budget = ctx.infer.max_memory
    if not budget:
        return None
    converted: dict[int | str, str] = {}
    dropped: list[str] = []
    for key, value in budget.items():
        if key.isdigit():
            if ctx.device.type != "cuda":
                dropped.append(key)
                continue
            converted[int(key)] = value
        else:
            converted[key] = value
    if dropped:
        ctx.warn(
            "max_memory_ignored",
            f"max_memory for GPU {', '.join(dropped)} ignored: this run is on the CPU",
            requested=budget,
            used=converted or None,
        )
    return converted or None


def load_kwargs(ctx: InferContext) -> dict[str, Any]:
    """from_pretrained keyword arguments for precision, placement, offload and 8-bit weights.

    `device_map="auto"` (accelerate) is used when asked for, when a memory budget is given, or for
    8-bit weights; otherwise the model is loaded whole and moved to the device by the caller.
    """
    infer = ctx.infer
    kwargs: dict[str, Any] = {"dtype": ctx.precision.dtype}
    max_memory = _max_memory(ctx)
    use_map = infer.device_map == "auto" or (infer.device_map is None and (max_memory or infer.load_in_8bit))
    if infer.device_map == "none" and infer.max_memory:
        ctx.warn(
            "max_memory_ignored",
            "max_memory needs device_map auto; device_map is none, so the budget is ignored",
            requested=infer.max_memory,
        )
    if use_map:
        kwargs["device_map"] = "auto" if ctx.device.type == "cuda" or max_memory else "cpu"
        if max_memory:
            kwargs["max_memory"] = max_memory
        # Layers that fit nowhere else go to disk here instead of failing the load.
        kwargs["offload_folder"] = str(ctx.run_dir / "offload")
    elif ctx.device.type == "cuda":
        # Straight onto the GPU: loading on the host first would need the model's size in RAM.
        kwargs["device_map"] = device_name(ctx.device)
    if infer.load_in_8bit:
        import transformers

        bnb_config: Any = transformers.BitsAndBytesConfig
        kwargs["quantization_config"] = bnb_config(load_in_8bit=True)
    return kwargs


def uses_device_map(kwargs: dict[str, Any]) -> bool:
    return "device_map" in kwargs


def load_with_attention(
    ctx: InferContext, loader: Callable[..., Any], path: Path, kwargs: dict[str, Any]
) -> tuple[Any, str]:
    """Load with the requested attention kernel, falling back (sdpa, then eager) when the model or
    the installation cannot use it; a `warning` event names what was used instead.
    """
    requested = ctx.infer.attn_implementation
    candidates = [requested, *(a for a in ATTN_FALLBACKS if a != requested)]
    first_error: Exception | None = None
    for attn in candidates:
        try:
            model = loader(path, attn_implementation=attn, **kwargs)
        except (ImportError, ValueError) as exc:
            # transformers raises ValueError for "does not support sdpa" and ImportError for a
            # missing flash-attn package; anything else (OOM included) is not ours to retry.
            if first_error is None:
                first_error = exc
            continue
        used = str(getattr(model.config, "_attn_implementation", None) or attn)
        if used != requested:
            reason = f" ({str(first_error).splitlines()[0][:300]})" if first_error else ""
            ctx.warn(
                "attn_implementation_unavailable",
                f"attn_implementation {requested} cannot be used with this model{reason}; using {used}",
                requested=requested,
                used=used,
            )
        return model, used
    assert first_error is not None
    raise first_error


def check_offload(ctx: InferContext, model: Any) -> None:
    """Weights that did not fit the budget run from host memory or disk — slower.

    accelerate records each module's placement in `hf_device_map`; anything on "cpu" (for a GPU
    run) or "disk" is offloaded. The warning keeps the code `offloaded_to_cpu` for both, since
    the remedy (a larger max_memory, lower precision, 8-bit) is the same.
    """
    device_map = getattr(model, "hf_device_map", None)
    if not isinstance(device_map, dict):
        return
    counts: dict[str, int] = {}
    for placement in device_map.values():
        counts[str(placement)] = counts.get(str(placement), 0) + 1
    ctx.report.device_map = counts
    offload_targets = {"disk"} if ctx.device.type == "cpu" else {"cpu", "disk"}
    offloaded = {k: v for k, v in counts.items() if k in offload_targets}
    if not offloaded:
        return
    where = ", ".join(f"{n} on {k}" for k, n in offloaded.items())
    ctx.warn(
        "offloaded_to_cpu",
        f"some model modules do not fit the memory budget and were offloaded ({where} of "
        f"{sum(counts.values())} module groups): generation is slower — raise max_memory, lower "
        "precision or use load_in_8bit",
        requested=ctx.infer.max_memory,
        used=counts,
    )


def place_model(ctx: InferContext, model: Any, kwargs: dict[str, Any]) -> Any:
    """Move a whole-loaded model to the device and switch to eval mode."""
    if not uses_device_map(kwargs):
        model = model.to(ctx.device)
    model.eval()
    return model


def maybe_compile(ctx: InferContext, model: Any) -> None:
    """`compile: true` → torch.compile the forward pass (CUDA graphs with a static cache on CUDA).

    transformers' own auto-compilation is switched off in `generate` (disable_compile) so the
    spec alone decides; with a dynamic cache the graph is compiled with dynamic shapes, since the
    sequence grows every step.
    """
    if not ctx.infer.compile:
        return
    static = ctx.infer.kv_cache == "static"
    mode = "reduce-overhead" if static and ctx.device.type == "cuda" else None
    model.forward = torch.compile(model.forward, mode=mode, dynamic=None if static else True)


def generation_kwargs(ctx: InferContext, pad_token_id: int | None) -> dict[str, Any]:
    """Keyword arguments of `model.generate` shared by both tasks."""
    infer = ctx.infer
    kwargs: dict[str, Any] = {
        "max_new_tokens": infer.max_new_tokens,
        "do_sample": infer.do_sample,
        "disable_compile": True,
    }
    if infer.do_sample:
        kwargs["temperature"] = infer.temperature
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    if infer.kv_cache == "static":
        kwargs["cache_implementation"] = "static"
    return kwargs


def is_compile_failure(exc: BaseException) -> bool:
    """An exception raised by the torch.compile machinery rather than by the model."""
    module = type(exc).__module__
    return module.startswith(("torch._dynamo", "torch._inductor"))


def oom_exit(ctx: InferContext, exc: BaseException, phase: str, batch_size: int | None) -> int | None:
    """If `exc` is an out-of-memory failure: write the `oom` event and return EXIT_OOM; else None."""
    from gpuwarden.core.oom.classify import classify_exception

    verdict = classify_exception(exc)
    if not verdict.is_oom:
        return None
    ctx.events.emit(
        Oom(
            verdict=verdict.verdict,
            message=verdict.message,
            fields=verdict.fields,
            phase=phase,
            batch_size=batch_size,
            step=ctx.step,
        )
    )
    ctx.events.fsync()
    print(
        f"gpuwarden: out of memory in {phase} at batch size {batch_size} ({verdict.verdict}): "
        f"{verdict.message}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_OOM


def timed_sync(device: torch.device) -> float:
    """A timestamp taken after queued device work finished, so batch times include GPU work."""
    synchronize(device)
    return time.perf_counter()
