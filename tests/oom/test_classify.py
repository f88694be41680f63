"""Every out-of-memory message form in oom.md and machine-facts.md, its numbers and its verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.core.oom.classify import (
    Classification,
    cgroup_dir_of,
    classify_exception,
    classify_text,
    oom_kill_grew,
    parse_size,
    read_oom_kill_count,
)

GiB = 1 << 30
MiB = 1 << 20


def gib(x: float) -> int:
    return round(x * GiB)


def mib(x: float) -> int:
    return round(x * MiB)


# The current form exactly as oom.md quotes it (with "Process N has" and "allowed").
CURRENT_FULL = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.21 GiB is free. Process 6123 has 77.66 GiB memory in use. "
    "Including non-PyTorch memory, this process has 93.75 GiB memory in use. 75.23 GiB allowed; Of the "
    "allocated memory 91.23 GiB is allocated by PyTorch, and 1.40 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# The current form without the process list and without "allowed".
CURRENT_PLAIN = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total "
    "capacity of 23.65 GiB of which 301.56 MiB is free. Of the allocated memory 22.01 GiB is allocated "
    "by PyTorch, and 1.05 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
OLD_FORM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 7.03 GiB (GPU 0; 10.00 GiB total capacity; "
    "2.46 GiB already allocated; 5.26 GiB free; 2.49 GiB reserved in total by PyTorch)"
)
OLD_FORM_ALLOWED = (
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.76 GiB total capacity; "
    "3.20 GiB already allocated; 9.00 GiB free; 3.50 GiB allowed; 3.40 GiB reserved in total by PyTorch) "
    "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
)
# PyTorch 2.1 spelled "capacty".
MISSPELLED = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total "
    "capacty of 11.76 GiB of which 912.00 MiB is free. Including non-PyTorch memory, this process has "
    "10.86 GiB memory in use. Of the allocated memory 9.80 GiB is allocated by PyTorch, and 730.00 MiB "
    "is reserved by PyTorch but unallocated."
)
HIP_FORM = (
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity "
    "of 63.98 GiB of which 2.00 GiB is free. Of the allocated memory 60.10 GiB is allocated by PyTorch, "
    "and 1.20 GiB is reserved by PyTorch but unallocated."
)
XPU_FORM = (
    "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
    "of 11.93 GiB of which 5.62 MiB is free. Of the allocated memory 10.43 GiB is allocated by PyTorch, "
    "and 94.57 MiB is reserved by PyTorch but unallocated. Please use `empty_cache` to release all "
    "unoccupied cached memory."
)
MPS_FORM = (
    "RuntimeError: MPS backend out of memory (MPS allocated: 17.36 GB, other allocations: 613.56 MB, "
    "max allowed: 18.13 GB). Tried to allocate 192.00 MB on private pool. Use "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause "
    "system failure)."
)
CPU_FORM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
    "memory: you tried to allocate 4000000000 bytes. Error code 12 (Cannot allocate memory)"
)


def test_parse_size_forms() -> None:
    assert parse_size("2.00 GiB") == 2 * GiB
    assert parse_size("512.00 MiB") == 512 * MiB
    assert parse_size("7178 GiB") == 7178 * GiB
    assert parse_size("4000000000 bytes") == 4_000_000_000
    assert parse_size("0 bytes") == 0
    assert parse_size("1.50 KiB") == 1536
    assert parse_size("9.06 GB") == round(9.06 * GiB)  # MPS printed binary sizes as "GB"
    assert parse_size("15GiB") == 15 * GiB
    for bad in ("", "lots", "2.0 parsecs", "GiB"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


def test_current_form_full_fields_exact() -> None:
    c = classify_text(CURRENT_FULL)
    assert c.fields["requested"] == gib(2.00)
    assert c.fields["gpu_index"] == 0
    assert c.fields["total"] == gib(79.10)
    assert c.fields["free"] == gib(1.21)
    assert c.fields["other_processes"] == gib(77.66)
    assert c.fields["other_pids"] == "6123"
    assert c.fields["this_process"] == gib(93.75)
    assert c.fields["allowed"] == gib(75.23)
    assert c.fields["allocated"] == gib(91.23)
    assert c.fields["reserved_unallocated"] == gib(1.40)
    assert c.fields["device"] == "cuda"
    assert c.message.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    # The device says total − free − this process is nothing: the "Process 6123" line is this
    # process seen through a container's PID namespace, not another tenant.
    assert c.fields["held_by_others"] == 0
    assert c.verdict == "gpu_capacity"
    assert c.is_oom and c.retunable
    assert "allowed" in c.reason


def test_current_form_without_processes_and_allowed() -> None:
    c = classify_text(CURRENT_PLAIN)
    assert c.fields["gpu_index"] == 1
    assert c.fields["requested"] == 512 * MiB
    assert c.fields["free"] == mib(301.56)
    assert c.fields["allocated"] == gib(22.01)
    assert c.fields["reserved_unallocated"] == gib(1.05)
    assert "allowed" not in c.fields and "other_processes" not in c.fields and "this_process" not in c.fields
    assert c.verdict == "gpu_capacity"


def test_old_form_fields_and_verdict() -> None:
    c = classify_text(OLD_FORM)
    assert c.fields["form"] == "legacy"
    assert c.fields["requested"] == gib(7.03)
    assert c.fields["total"] == gib(10.00)
    assert c.fields["allocated"] == gib(2.46)
    assert c.fields["free"] == gib(5.26)
    assert c.fields["reserved"] == gib(2.49)
    assert c.fields["reserved_unallocated"] == gib(2.49) - gib(2.46)
    assert c.verdict == "gpu_capacity"


def test_old_form_with_allowed() -> None:
    c = classify_text(OLD_FORM_ALLOWED)
    assert c.fields["allowed"] == gib(3.50)
    assert c.fields["reserved"] == gib(3.40)
    assert c.verdict == "gpu_capacity"


def test_capacty_misspelling() -> None:
    c = classify_text(MISSPELLED)
    assert c.fields["total"] == gib(11.76)
    assert c.fields["free"] == 912 * MiB
    assert c.fields["this_process"] == gib(10.86)
    assert c.verdict == "gpu_capacity"


@pytest.mark.parametrize(
    ("text", "device", "requested"),
    [(HIP_FORM, "hip", 4 * GiB), (XPU_FORM, "xpu", 20 * MiB)],
)
def test_hip_and_xpu_forms(text: str, device: str, requested: int) -> None:
    c = classify_text(text)
    assert c.fields["device"] == device
    assert c.fields["requested"] == requested
    assert c.verdict == "gpu_capacity"


def test_mps_form() -> None:
    c = classify_text(MPS_FORM)
    assert c.fields["device"] == "mps"
    assert c.fields["allocated"] == round(17.36 * GiB)
    assert c.fields["other_allocations"] == round(613.56 * MiB)
    assert c.fields["allowed"] == round(18.13 * GiB)
    assert c.fields["requested"] == 192 * MiB
    assert c.verdict == "gpu_capacity"


@pytest.mark.parametrize(
    ("text", "source"),
    [
        (
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "cuda_error",
        ),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "cublas",
        ),
        ("host:123:456 [0] include/alloc.h:48 NCCL WARN Failed to CUDA calloc 6291456 bytes", "nccl"),
        (
            "torch._inductor.exc.InductorError: RuntimeError: Failed to run autotuning code block: "
            "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
            "of which 200.00 MiB is free.",
            "inductor_autotune",
        ),
    ],
)
def test_other_gpu_forms_are_capacity(text: str, source: str) -> None:
    c = classify_text(text)
    assert c.verdict == "gpu_capacity"
    assert c.fields["source"] == source
    assert c.message == text.splitlines()[0].strip()


def test_oldest_forms() -> None:
    cached = classify_text(
        "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
        "8.57 GiB already allocated; 9.28 MiB free; 10.80 GiB cached)"
    )
    assert cached.fields["reserved"] == gib(10.80)
    assert cached.fields["reserved_unallocated"] == gib(10.80) - gib(8.57)
    assert cached.verdict == "gpu_fragmentation"  # 2.23 GiB cached but unused: 26 % of allocated
    thc = classify_text(
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCGeneral.cpp:844"
    )
    assert thc.verdict == "gpu_capacity" and thc.fields["source"] == "cuda_error"


def test_xla_and_tensorflow_forms() -> None:
    xla = classify_text(
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "17179869184 bytes."
    )
    assert xla.verdict == "gpu_capacity"
    assert xla.fields["requested"] == 16 * GiB
    tf = classify_text(
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[64,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0"
    )
    assert tf.verdict == "gpu_capacity" and tf.fields["source"] == "tensorflow"


def test_inductor_numbers_are_parsed() -> None:
    text = (
        "RuntimeError: Failed to run autotuning code block: CUDA out of memory. Tried to allocate "
        "1.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 200.00 MiB is free."
    )
    c = classify_text(text)
    assert c.fields["requested"] == GiB and c.fields["free"] == 200 * MiB


def test_cudnn_not_supported_needs_evidence() -> None:
    cudnn = (
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in "
        "a non-contiguous input."
    )
    alone = classify_text(cudnn)
    assert alone.verdict == "not_oom"
    assert "cuDNN NOT_SUPPORTED" in alone.reason
    with_pressure = classify_text(cudnn, memory_pressure=True)
    assert with_pressure.verdict == "gpu_capacity"
    assert with_pressure.fields["source"] == "cudnn_not_supported"
    after_oom = classify_text(CURRENT_PLAIN + "\nDuring handling...\n" + cudnn)
    assert after_oom.verdict == "gpu_capacity"
    assert after_oom.message.startswith("RuntimeError: cuDNN error")
    assert after_oom.fields["requested"] == 512 * MiB  # numbers from the allocator message before it


def test_host_cpu_allocator_exact_string() -> None:
    c = classify_text(CPU_FORM)
    assert c.verdict == "host_oom"
    assert c.fields["requested"] == 4_000_000_000
    assert c.message == CPU_FORM
    assert c.retunable


def test_a_host_allocation_under_the_runs_memory_limit_is_said_to_be_at_the_limit() -> None:
    # A user with gigabytes free is not told the host ran out: it was the run's own limit.
    assert classify_text(CPU_FORM).reason.endswith(": host memory exhausted")
    limited = classify_text(CPU_FORM, memory_limit=1300 * MiB)
    assert limited.verdict == "host_oom" and limited.fields["requested"] == 4_000_000_000
    assert (
        limited.reason
        == "host allocator could not allocate 3.73 GiB: the run's memory limit (1.27 GiB of address space) reached"
    )
    memory_error = classify_text("MemoryError", memory_limit=6 * GiB)
    assert (
        memory_error.reason
        == "Python raised MemoryError: the run's memory limit (6.00 GiB of address space) reached"
    )
    # The kernel's OOM killer never acts on an address-space limit: the host's memory it is.
    killed = "RuntimeError: DataLoader worker (pid 31337) is killed by signal: Killed. "
    assert classify_text(killed, memory_limit=6 * GiB).reason.endswith(": host memory exhausted")


def test_dataloader_worker_killed() -> None:
    text = "RuntimeError: DataLoader worker (pid 31337) is killed by signal: Killed. "
    c = classify_text(text)
    assert c.verdict == "host_oom"
    assert c.fields["pid"] == 31337


def test_dataloader_killed_by_other_signal_is_not_oom() -> None:
    c = classify_text("RuntimeError: DataLoader worker (pid 31337) is killed by signal: Segmentation fault.")
    assert c.verdict == "not_oom"


@pytest.mark.parametrize(("exit_code", "signal"), [(137, None), (-9, None), (None, 9)])
def test_sigkill_needs_oom_killer_evidence(exit_code: int | None, signal: int | None) -> None:
    plain = classify_text("step 100 loss 2.1\n", exit_code=exit_code, signal=signal)
    assert plain.verdict == "not_oom"
    assert plain.reason == "killed by SIGKILL; no OOM-killer evidence"
    unknown = classify_text("", exit_code=exit_code, signal=signal, oom_kill=None)
    assert unknown.verdict == "not_oom"
    proven = classify_text("", exit_code=exit_code, signal=signal, oom_kill=True)
    assert proven.verdict == "host_oom"
    assert "oom_kill" in proven.reason


def test_oom_kill_without_sigkill_and_without_text() -> None:
    c = classify_text("Traceback ...\nRuntimeError: worker exited", exit_code=1, oom_kill=True)
    assert c.verdict == "host_oom"


def test_ordinary_exit_is_not_oom() -> None:
    c = classify_text("ValueError: bad data in row 7", exit_code=1, oom_kill=False)
    assert c.verdict == "not_oom"
    assert c.message == ""
    assert not c.is_oom and not c.retunable


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "illegal memory access"),
        (
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, "
            "Hardware limit: 65536. Reducing block sizes or `num_stages` may help.",
            "shared memory",
        ),
        (
            "[rank1]:[E ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds",
            "NCCL",
        ),
    ],
)
def test_not_oom_signals(text: str, needle: str) -> None:
    c = classify_text(text)
    assert c.verdict == "not_oom"
    assert needle in c.reason
    assert c.message == text


def test_oom_beats_nccl_timeouts_of_waiting_ranks() -> None:
    text = (
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 23.65 GiB of which 100.00 MiB is free.\n"
        "[rank1]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran for 600000 ms\n"
    )
    assert classify_text(text).verdict == "gpu_capacity"


def test_request_above_total_is_shape_bug() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7178.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 77.00 GiB is free."
    )
    c = classify_text(text)
    assert c.verdict == "shape_bug"
    assert c.fields["requested"] == 7178 * GiB
    assert "larger than the whole card" in c.reason
    assert not c.is_oom and not c.retunable


def test_shape_bug_from_capacity_when_message_has_no_total() -> None:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7178 GiB"
    assert classify_text(text).verdict == "gpu_capacity"
    assert classify_text(text, capacity=80 * GiB).verdict == "shape_bug"


def fragmented(unallocated: str, free: str = "1.00 GiB", request: str = "3.00 GiB") -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request}. GPU 0 has a total "
        f"capacity of 23.65 GiB of which {free} is free. Including non-PyTorch memory, this process has "
        "22.60 GiB memory in use. Of the allocated memory 12.00 GiB is allocated by PyTorch, and "
        f"{unallocated} is reserved by PyTorch but unallocated."
    )


def test_fragmentation_threshold() -> None:
    frag = classify_text(fragmented("4.80 GiB"))  # 40 % of allocated
    assert frag.verdict == "gpu_fragmentation"
    assert frag.reason == "reserved-but-unallocated 4.80 GiB is 40 % of allocated: fragmentation"
    assert classify_text(fragmented("2.00 GiB")).verdict == "gpu_capacity"  # 17 %


def test_fragmentation_needs_the_request_to_fit_if_defragmented() -> None:
    # 40 % of allocated is cached, but 3.00 free + 4.80 cached is still below a 9 GiB request.
    assert (
        classify_text(fragmented("4.80 GiB", free="3.00 GiB", request="9.00 GiB")).verdict == "gpu_capacity"
    )


def test_contention_from_device_numbers() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity "
        "of 11.76 GiB of which 1.00 GiB is free. Process 4242 has 6.00 GiB memory in use. Including "
        "non-PyTorch memory, this process has 4.70 GiB memory in use. Of the allocated memory 4.00 GiB is "
        "allocated by PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated."
    )
    c = classify_text(text)
    # Contention wins over the 50 % fragmentation: waiting, not the allocator, is the fix.
    assert c.verdict == "gpu_contention"
    assert c.fields["other_processes"] == 6 * GiB
    assert c.fields["held_by_others"] == gib(11.76) - gib(1.00) - gib(4.70)
    assert c.reason.startswith("other processes hold 6.06 GiB of 11.76 GiB")


def test_contention_from_process_lines_only() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
        "of 11.76 GiB of which 100.00 MiB is free. Process 11 has 2.00 GiB memory in use. Process 12 has "
        "2.00 GiB memory in use. Of the allocated memory 6.00 GiB is allocated by PyTorch, and 100.00 MiB "
        "is reserved by PyTorch but unallocated."
    )
    c = classify_text(text)
    assert c.fields["other_process_count"] == 2
    assert c.fields["other_pids"] == "11,12"
    assert c.verdict == "gpu_contention"  # 4 GiB of 11.76 GiB = 34 %
    text_small = text.replace("Process 12 has 2.00 GiB memory in use. ", "")
    assert classify_text(text_small).verdict == "gpu_capacity"  # 2 GiB = 17 %


def test_contention_from_old_form() -> None:
    text = (
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 12.00 GiB total capacity; "
        "3.00 GiB already allocated; 500.00 MiB free; 3.10 GiB reserved in total by PyTorch)"
    )
    assert classify_text(text).verdict == "gpu_contention"


def test_last_oom_in_text_wins() -> None:
    text = "\n".join(
        [
            "Traceback (most recent call last):",
            fragmented("4.80 GiB"),
            "",
            "During handling of the above exception, another exception occurred:",
            "Traceback (most recent call last):",
            CPU_FORM,
        ]
    )
    assert classify_text(text).verdict == "host_oom"
    reversed_text = CPU_FORM + "\n" + fragmented("4.80 GiB")
    assert classify_text(reversed_text).verdict == "gpu_fragmentation"


def test_wrapped_allocator_message_is_parsed_across_lines() -> None:
    text = (
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB.\n"
        "GPU 0 has a total capacity of 11.93 GiB of which 5.62 MiB is free.\n"
        "Of the allocated memory 10.43 GiB is allocated by PyTorch,\n"
        "and 94.57 MiB is reserved by PyTorch but unallocated.\n"
    )
    c = classify_text(text)
    assert c.fields["total"] == gib(11.93)
    assert c.fields["reserved_unallocated"] == mib(94.57)
    assert c.message == "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB."


def test_to_dict_round_trip() -> None:
    c = classify_text(CURRENT_PLAIN)
    d = c.to_dict()
    assert d["verdict"] == "gpu_capacity" and d["is_oom"] is True and d["retunable"] is True
    assert d["fields"] == c.fields
    assert Classification(d["verdict"], d["message"], d["fields"], d["reason"]) == c


# ---------------------------------------------------------------------------------- exceptions

# Stand-ins with torch's qualified names: the classifier must recognise them without torch.
TorchOOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
CudaOOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
NotTorchOOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "mylib"})


def raise_chain(inner: BaseException, outer: BaseException, *, explicit: bool) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            if explicit:
                raise outer from exc
            raise outer  # noqa: B904 — the implicit chain (only __context__) is what is tested
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


def test_exception_type_first_even_with_unparseable_text() -> None:
    c = classify_exception(TorchOOM("something went wrong"))
    assert c.verdict == "gpu_capacity"
    assert c.fields["source"] == "exception_type"
    assert "torch.OutOfMemoryError" in c.reason


def test_exception_type_with_allocator_text() -> None:
    c = classify_exception(CudaOOM(fragmented("6.00 GiB")))
    assert c.verdict == "gpu_fragmentation"
    assert c.fields["allocated"] == 12 * GiB


def test_exception_chain_cause_and_context() -> None:
    wrapped = raise_chain(TorchOOM(CURRENT_PLAIN), ValueError("training step failed"), explicit=True)
    assert wrapped.__cause__ is not None
    assert classify_exception(wrapped).verdict == "gpu_capacity"
    implicit = raise_chain(CudaOOM(CURRENT_PLAIN), KeyError("during cleanup"), explicit=False)
    assert implicit.__cause__ is None and implicit.__context__ is not None
    assert classify_exception(implicit).fields["requested"] == 512 * MiB


def test_exception_other_module_same_name_is_judged_by_text() -> None:
    assert classify_exception(NotTorchOOM("disk quota exceeded")).verdict == "not_oom"
    assert classify_exception(NotTorchOOM(CPU_FORM)).verdict == "host_oom"


def test_exception_host_forms() -> None:
    assert classify_exception(RuntimeError(CPU_FORM)).verdict == "host_oom"
    assert classify_exception(MemoryError()).verdict == "host_oom"
    wrapped = raise_chain(MemoryError(), RuntimeError("loader failed"), explicit=True)
    assert classify_exception(wrapped).verdict == "host_oom"


def test_exception_text_fallback_and_non_oom() -> None:
    assert classify_exception(RuntimeError("CUDA error: out of memory")).verdict == "gpu_capacity"
    c = classify_exception(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert c.verdict == "not_oom"
    assert classify_exception(ValueError("shape mismatch")).verdict == "not_oom"


def test_exception_chain_cycle_terminates() -> None:
    a = RuntimeError("a")
    b = RuntimeError("b")
    a.__context__ = b
    b.__context__ = a
    assert classify_exception(a).verdict == "not_oom"


def test_real_cpu_allocation_failure_in_child() -> None:
    """A real failure from a real allocator (oom.md: test recovery with real failures).

    Without torch in the core, the real allocator at hand is Python's: a child with an
    address-space limit raises MemoryError, whose traceback the classifier must read.
    """
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20)); "
        "x = bytearray(1 << 30)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    c = classify_text(proc.stderr, exit_code=proc.returncode)
    assert c.verdict == "host_oom"
    assert c.message == "MemoryError"


# -------------------------------------------------------------------------------------- cgroup


def test_read_oom_kill_count_from_memory_events(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert read_oom_kill_count(tmp_path) == 2
    assert oom_kill_grew(2, 3) is True
    assert oom_kill_grew(2, 2) is False
    assert oom_kill_grew(None, 3) is None


def test_read_oom_kill_count_unreadable(tmp_path: Path) -> None:
    assert read_oom_kill_count(tmp_path) is None
    (tmp_path / "memory.events").write_text("low 0\n")
    assert read_oom_kill_count(tmp_path) is None
    (tmp_path / "memory.events").write_text("oom_kill many\n")
    assert read_oom_kill_count(tmp_path) is None


def test_cgroup_dir_of_reads_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text("0::/user.slice/run-1.scope\n")
    root = tmp_path / "cg"
    assert cgroup_dir_of(42, proc=proc, root=root) == root / "user.slice/run-1.scope"
    (proc / "42" / "cgroup").write_text("12:memory:/docker/abc\n")  # cgroup v1 only
    assert cgroup_dir_of(42, proc=proc, root=root) is None
    assert cgroup_dir_of(43, proc=proc, root=root) is None


def test_read_oom_kill_count_of_this_process_is_int_or_none() -> None:
    value = read_oom_kill_count()
    assert value is None or (isinstance(value, int) and value >= 0)


REAL_TORCH_CHILD = """
import json, resource, sys
import torch
from gpuwarden.core.oom.classify import classify_exception
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
try:
    torch.empty(4_000_000_000, dtype=torch.uint8)
except BaseException as exc:
    print(json.dumps(classify_exception(exc).to_dict()))
    raise
"""


@pytest.mark.slow
def test_real_torch_cpu_allocator_failure() -> None:
    """torch's real CPU allocator under an address-space limit (machine-facts.md), classified both
    from the exception in the child and from the child's stderr as the daemon sees it."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", REAL_TORCH_CHILD], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    in_child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert in_child["verdict"] == "host_oom"
    assert in_child["fields"]["requested"] == 4_000_000_000
    from_stderr = classify_text(proc.stderr, exit_code=proc.returncode)
    assert from_stderr.verdict == "host_oom"
    assert "DefaultCPUAllocator: can't allocate memory" in from_stderr.message
