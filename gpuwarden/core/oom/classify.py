"""Classify a failed run: which kind of out-of-memory it was, or that it was none.

The daemon sees a run's stderr and exit status; the runners see the exception. Both come here.
Out-of-memory messages changed across PyTorch versions (one spells "capacty"), so the patterns
are tolerant, and the allocator's numbers decide between capacity, fragmentation, contention
and a shape bug. Nothing here imports torch: exception types are recognised by qualified name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Verdict = Literal["gpu_capacity", "gpu_fragmentation", "gpu_contention", "host_oom", "shape_bug", "not_oom"]
VERDICTS: tuple[Verdict, ...] = (
    "gpu_capacity",
    "gpu_fragmentation",
    "gpu_contention",
    "host_oom",
    "shape_bug",
    "not_oom",
)
RETUNABLE: frozenset[Verdict] = frozenset({"gpu_capacity", "gpu_fragmentation", "gpu_contention", "host_oom"})

# Share of allocated memory that, held reserved-but-unallocated, marks fragmentation (oom.md: ≳ 25 %).
FRAGMENTATION_SHARE = 0.25
# Share of the card held by other processes that marks contention.
CONTENTION_SHARE = 0.25
# Longest message line kept in a Classification (allocator lines run to ~700 characters).
MAX_MESSAGE_CHARS = 2000
# How far past the matched line the allocator's numbers may continue (wrapped log lines).
DETAIL_WINDOW_CHARS = 3000

SIGKILL = 9


@dataclass(frozen=True)
class Classification:
    """The verdict on one failure, with the evidence that led to it."""

    verdict: Verdict
    message: str
    fields: dict[str, float | int | str] = field(default_factory=dict)
    reason: str = ""

    @property
    def is_oom(self) -> bool:
        """An out-of-memory failure (GPU or host); a shape bug asks for memory no card has, so no."""
        return self.verdict not in ("not_oom", "shape_bug")

    @property
    def retunable(self) -> bool:
        """A failure a retune policy may answer with a changed restart."""
        return self.verdict in RETUNABLE

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form, for events and the store."""
        return {
            "verdict": self.verdict,
            "message": self.message,
            "fields": dict(self.fields),
            "reason": self.reason,
            "is_oom": self.is_oom,
            "retunable": self.retunable,
        }


# --------------------------------------------------------------------------------------- sizes

_UNIT_BYTES: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
    "p": 1 << 50,
    "pb": 1 << 50,
    "pib": 1 << 50,
}
_SIZE_TEXT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
# A size inside allocator text: "2.00 GiB", "512 bytes", "9.06 GB" (MPS before 2.3), "0 bytes".
_SIZE = r"(\d+(?:\.\d+)?\s*(?:[KMGTPkmgtp]i?B|bytes?|B)\b)"


def parse_size(text: str) -> int:
    """Bytes in an allocator size such as "2.00 GiB", "512.00 MiB", "7178 GiB", "4000000000 bytes".

    KB/MB/GB are read as powers of 1024, as PyTorch's allocators compute them (the MPS allocator
    printed binary sizes with decimal labels). Raises ValueError for text that is not a size.
    """
    match = _SIZE_TEXT_RE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    multiplier = _UNIT_BYTES.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}")
    return round(float(number) * multiplier)


def format_size(num_bytes: float) -> str:
    """A size for reasons: "3.10 GiB", "512.00 MiB", "100 bytes"."""
    value = float(num_bytes)
    if abs(value) < 1024:
        return f"{int(value)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.2f} {unit}"
    raise AssertionError("unreachable: TiB ends the loop")


# ------------------------------------------------------------------------------------ patterns

# Each signal is (source, pattern); the source names the message form in `fields["source"]`.
_GPU_SIGNALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("inductor_autotune", re.compile(r"Failed to run autotuning code block:.*out of memory", re.I)),
    ("allocator", re.compile(r"\b(CUDA|HIP|XPU) out of memory", re.I)),
    ("mps_allocator", re.compile(r"MPS backend out of memory", re.I)),
    ("cuda_error", re.compile(r"\b(CUDA|HIP)(?: driver)? error: out of memory", re.I)),
    ("cuda_error", re.compile(r"cudaErrorMemoryAllocation")),
    ("cublas", re.compile(r"CUBLAS_STATUS_ALLOC_FAILED")),
    ("cudnn_alloc", re.compile(r"CUDNN_STATUS_ALLOC_FAILED")),
    ("nccl", re.compile(r"Failed to CUDA calloc", re.I)),
    # PyTorch before 1.0 (THC): "cuda runtime error (2) : out of memory at …".
    ("cuda_error", re.compile(r"cuda runtime error \(2\) : out of memory", re.I)),
    # JAX/XLA and TensorFlow, for command runs that are not PyTorch.
    ("xla", re.compile(r"RESOURCE_EXHAUSTED: Out of memory", re.I)),
    ("tensorflow", re.compile(r"ResourceExhaustedError: OOM when allocating")),
)
_HOST_SIGNALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cpu_allocator", re.compile(r"DefaultCPUAllocator: can't allocate memory", re.I)),
    (
        "dataloader_killed",
        re.compile(r"DataLoader worker \(pid\(?s?\)? ?(\d+)\) is killed by signal: Killed"),
    ),
    ("memory_error", re.compile(r"^\s*MemoryError\b", re.M)),
    ("enomem", re.compile(r"\[Errno 12\] Cannot allocate memory")),
)
# cuDNN reports NOT_SUPPORTED both for real lack of workspace memory and for unsupported inputs.
_CUDNN_AMBIGUOUS = re.compile(r"CUDNN_STATUS_NOT_SUPPORTED")
# Failures that look memory-related but that no retune fixes, with the reason shown to the user.
_NOT_OOM_SIGNALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"illegal memory access was encountered", re.I),
        "illegal memory access: a kernel bug or corrupted state, not a lack of memory",
    ),
    (
        re.compile(r"out of resource: shared memory", re.I),
        "Triton kernel needs more shared memory per block than the GPU has: a kernel configuration "
        "problem, not a lack of memory",
    ),
    (
        re.compile(
            r"Watchdog caught collective operation timeout|NCCL[^\n]*\btim(?:ed|ing)? ?out|"
            r"ProcessGroupNCCL[^\n]*[Tt]imeout",
        ),
        "NCCL collective timed out: this rank waited for another one; classify the failing rank's log",
    ),
    (
        re.compile(r"device-side assert triggered", re.I),
        "device-side assert (for example an index out of range): a bug, not a lack of memory",
    ),
    (
        re.compile(r"insufficient shared memory \(shm\)", re.I),
        "/dev/shm too small for DataLoader workers: raise the container's --shm-size or lower num_workers",
    ),
)

# Numbers in the current allocator text (PyTorch ≥ 2.1), CUDA/HIP/XPU alike.
_RE_REQUESTED = re.compile(r"Tried to allocate " + _SIZE)
_RE_TOTAL_NEW = re.compile(
    r"GPU (\d+) has a total capac\w*ty of " + _SIZE + r"(?: of which " + _SIZE + " is free)?"
)
_RE_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + " memory in use")
_RE_THIS_PROCESS = re.compile(r"this process has " + _SIZE + " memory in use")
_RE_ALLOWED = re.compile(_SIZE + r" allowed;")
_RE_ALLOCATED_NEW = re.compile(r"Of the allocated memory " + _SIZE + " is allocated by PyTorch")
_RE_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
# The old form (PyTorch ≤ 2.0): "(GPU 0; 10.00 GiB total capacity; 2.46 GiB already allocated; …)".
_RE_GPU_OLD = re.compile(r"\(GPU (\d+);")
_RE_TOTAL_OLD = re.compile(_SIZE + r" total capac\w*ty")
_RE_ALLOCATED_OLD = re.compile(_SIZE + r" already allocated")
_RE_FREE_OLD = re.compile(_SIZE + r" free;")
_RE_RESERVED_OLD = re.compile(_SIZE + r" reserved in total by PyTorch")
# PyTorch 1.0–1.3 said "cached" where later versions say "reserved in total by PyTorch".
_RE_CACHED_OLD = re.compile(_SIZE + r" cached\)")
# MPS: "MPS backend out of memory (MPS allocated: X, other allocations: Y, max allowed: Z)".
_RE_MPS_ALLOCATED = re.compile(r"MPS allocated:? " + _SIZE)
_RE_MPS_OTHER = re.compile(r"other allocations: " + _SIZE)
_RE_MPS_ALLOWED = re.compile(r"max allowed: " + _SIZE)
# XLA: "Out of memory while trying to allocate 17179869184 bytes".
_RE_XLA_REQUESTED = re.compile(r"trying to allocate (\d+) bytes", re.I)
# Host.
_RE_CPU_REQUESTED = re.compile(r"you tried to allocate (\d+) bytes", re.I)


@dataclass(frozen=True)
class _Match:
    start: int
    family: Literal["gpu", "host", "ambiguous"]
    source: str
    device: str | None


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end >= 0 else len(text)].strip()
    return line[:MAX_MESSAGE_CHARS]


def _find_matches(text: str) -> list[_Match]:
    found: list[_Match] = []
    for source, pattern in _GPU_SIGNALS:
        for m in pattern.finditer(text):
            device = "cuda"
            if source == "allocator":
                device = m.group(1).lower()
            elif source == "mps_allocator":
                device = "mps"
            elif source == "cuda_error" and m.lastindex:
                device = m.group(1).lower()
            found.append(_Match(m.start(), "gpu", source, device))
    for source, pattern in _HOST_SIGNALS:
        for m in pattern.finditer(text):
            found.append(_Match(m.start(), "host", source, "cpu"))
    for m in _CUDNN_AMBIGUOUS.finditer(text):
        found.append(_Match(m.start(), "ambiguous", "cudnn_not_supported", "cuda"))
    found.sort(key=lambda mt: mt.start)
    return found


def _last_line_match(matches: list[_Match], text: str) -> _Match:
    """The match on the last line that has one (stderr may hold several tracebacks; the last
    failure is the one that ended the run). On that line Inductor's wrapper wins over the
    "CUDA out of memory" it quotes."""
    last_line_start = max(text.rfind("\n", 0, m.start) for m in matches)
    on_line = [m for m in matches if text.rfind("\n", 0, m.start) == last_line_start]
    for m in on_line:
        if m.source == "inductor_autotune":
            return m
    return max(on_line, key=lambda m: m.start)


def _size_of(pattern: re.Pattern[str], text: str, group: int = 1) -> int | None:
    m = pattern.search(text)
    if m is None or m.group(group) is None:
        return None
    return parse_size(m.group(group))


Fields = dict[str, float | int | str]

# Sizes that may follow the current form's total; the first pattern that matches names each.
_CURRENT_SIZES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("this_process", _RE_THIS_PROCESS),
    ("allowed", _RE_ALLOWED),
    ("allocated", _RE_ALLOCATED_NEW),
    ("reserved_unallocated", _RE_UNALLOCATED),
)
_LEGACY_SIZES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("allocated", _RE_ALLOCATED_OLD),
    ("free", _RE_FREE_OLD),
    ("allowed", _RE_ALLOWED),
    ("reserved", _RE_RESERVED_OLD),
    ("reserved", _RE_CACHED_OLD),
)
_MPS_SIZES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("allocated", _RE_MPS_ALLOCATED),
    # Allocations of this process outside the MPS allocator, not other processes.
    ("other_allocations", _RE_MPS_OTHER),
    ("allowed", _RE_MPS_ALLOWED),
)


def _parse_gpu_fields(detail: str) -> Fields:
    """Every allocator number in `detail` (one message, line breaks already folded)."""
    out: Fields = {}
    requested = _requested(detail)
    if requested is not None:
        out["requested"] = requested
    for form in (_current_form, _legacy_form, _mps_form):
        fields = form(detail)
        if fields is not None:
            return out | fields
    return out


def _requested(detail: str) -> int | None:
    requested = _size_of(_RE_REQUESTED, detail)
    if requested is not None:
        return requested
    xla = _RE_XLA_REQUESTED.search(detail)
    return int(xla.group(1)) if xla is not None else None


def _sizes(detail: str, patterns: tuple[tuple[str, re.Pattern[str]], ...]) -> dict[str, int]:
    """Each named size found in `detail`; a name with several patterns takes the first that matches."""
    found: dict[str, int] = {}
    for name, pattern in patterns:
        value = _size_of(pattern, detail) if name not in found else None
        if value is not None:
            found[name] = value
    return found


def _current_form(detail: str) -> Fields | None:
    """PyTorch ≥ 2.1: the card's total and free, each process's share, and the allocator's split."""
    new = _RE_TOTAL_NEW.search(detail)
    if new is None:
        return None
    out: Fields = {"gpu_index": int(new.group(1)), "total": parse_size(new.group(2))}
    if new.group(3) is not None:
        out["free"] = parse_size(new.group(3))
    processes = [(int(pid), parse_size(size)) for pid, size in _RE_PROCESS.findall(detail)]
    if processes:
        out["other_processes"] = sum(size for _, size in processes)
        out["other_process_count"] = len(processes)
        out["other_pids"] = ",".join(str(pid) for pid, _ in processes)
    sizes = _sizes(detail, _CURRENT_SIZES)
    out |= sizes
    if "allocated" in sizes and "reserved_unallocated" in sizes:
        out["reserved"] = sizes["allocated"] + sizes["reserved_unallocated"]
    return out | {"form": "current"}


def _legacy_form(detail: str) -> Fields | None:
    """PyTorch ≤ 2.0: total, allocated, free and reserved; what is reserved but unallocated follows."""
    total = _size_of(_RE_TOTAL_OLD, detail)
    if total is None:
        return None
    out: Fields = {}
    gpu = _RE_GPU_OLD.search(detail)
    if gpu is not None:
        out["gpu_index"] = int(gpu.group(1))
    out["total"] = total
    sizes = _sizes(detail, _LEGACY_SIZES)
    out |= sizes
    if "reserved" in sizes and "allocated" in sizes:
        out["reserved_unallocated"] = max(0, sizes["reserved"] - sizes["allocated"])
    return out | {"form": "legacy"}


def _mps_form(detail: str) -> Fields | None:
    sizes = _sizes(detail, _MPS_SIZES)
    if "allocated" not in sizes:
        return None
    return {**sizes, "form": "mps"}


def _num(fields: dict[str, float | int | str], name: str) -> int | None:
    value = fields.get(name)
    return int(value) if isinstance(value, int | float) else None


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f} %"


def _gpu_verdict(fields: dict[str, float | int | str], capacity: int | None) -> tuple[Verdict, str]:
    """Decide among shape bug, contention, fragmentation and capacity from the parsed numbers.

    Contention is checked before fragmentation: when other processes hold the card, neither an
    allocator setting nor a smaller batch is the fix, and waiting or moving changes nothing in
    the run itself.
    """
    requested = _num(fields, "requested")
    total = _num(fields, "total")
    free = _num(fields, "free")
    ceiling = total if total is not None else capacity
    if requested is not None and ceiling is not None and requested > ceiling:
        return "shape_bug", (
            f"request of {format_size(requested)} is larger than the whole card "
            f"({format_size(ceiling)}): a shape or size bug, not a lack of memory"
        )
    held = _held_by_others(fields)
    if held is not None and total:
        fields["held_by_others"] = held
        if held > CONTENTION_SHARE * total:
            return "gpu_contention", (
                f"other processes hold {format_size(held)} of {format_size(total)} "
                f"({_pct(held, total)}): contention"
            )
    allocated = _num(fields, "allocated")
    unallocated = _num(fields, "reserved_unallocated")
    if allocated and unallocated is not None and unallocated >= FRAGMENTATION_SHARE * allocated:
        # Fragmentation means the memory exists but not in one piece; when even the cached and
        # free memory together are below the request, defragmenting cannot make it fit.
        fits_if_whole = requested is None or free is None or requested <= free + unallocated
        if fits_if_whole:
            return "gpu_fragmentation", (
                f"reserved-but-unallocated {format_size(unallocated)} is {_pct(unallocated, allocated)} "
                f"of allocated: fragmentation"
            )
    parts = []
    if requested is not None:
        parts.append(f"request of {format_size(requested)}")
    if free is not None:
        parts.append(f"{format_size(free)} free")
    limit = _num(fields, "allowed")
    if limit is not None:
        parts.append(f"{format_size(limit)} allowed")
    elif ceiling is not None:
        parts.append(f"of {format_size(ceiling)}")
    detail = " with ".join(parts[:2]) + (f" ({', '.join(parts[2:])})" if len(parts) > 2 else "")
    return "gpu_capacity", (f"{detail}: capacity" if detail else "out of GPU memory: capacity")


def _held_by_others(fields: dict[str, float | int | str]) -> int | None:
    """Bytes other processes hold on the card, from the most trustworthy numbers available.

    total − free − this process is what the device itself says; it is preferred over the sum of
    "Process N has …" lines because inside a container this process can appear there under a
    PID that does not match its own.
    """
    total = _num(fields, "total")
    free = _num(fields, "free")
    this = _num(fields, "this_process")
    if total is not None and free is not None and this is not None:
        return max(0, total - free - this)
    others = _num(fields, "other_processes")
    if others is not None:
        return others
    reserved = _num(fields, "reserved")
    if fields.get("form") == "legacy" and total is not None and free is not None and reserved is not None:
        # Old messages have no per-process numbers; what PyTorch did not reserve and is not free
        # belongs to someone else (plus this process's CUDA context, a few hundred MiB).
        return max(0, total - free - reserved)
    return None


_SOURCE_REASON: dict[str, str] = {
    "cuda_error": "the CUDA driver could not allocate memory",
    "cublas": "cuBLAS could not allocate its workspace",
    "cudnn_alloc": "cuDNN could not allocate its workspace",
    "nccl": "NCCL could not allocate its buffers",
    "inductor_autotune": "Inductor's autotuning ran out of GPU memory",
    "mps_allocator": "the MPS allocator reached its limit",
    "xla": "XLA could not allocate device memory",
    "tensorflow": "TensorFlow could not allocate a tensor",
    "cudnn_not_supported": "cuDNN NOT_SUPPORTED while GPU memory was exhausted",
}


def _classify_gpu(
    text: str, match: _Match, capacity: int | None, detail_text: str | None = None
) -> Classification:
    start = text.rfind("\n", 0, match.start) + 1
    window = detail_text if detail_text is not None else text[start : start + DETAIL_WINDOW_CHARS]
    fields = _parse_gpu_fields(" ".join(window.split()))
    fields["source"] = match.source
    if match.device is not None:
        fields["device"] = match.device
    verdict, reason = _gpu_verdict(fields, capacity)
    if verdict == "gpu_capacity" and "requested" not in fields and match.source in _SOURCE_REASON:
        reason = f"{_SOURCE_REASON[match.source]}: capacity"
    return Classification(verdict, _line_at(text, match.start), fields, reason)


def _classify_host(text: str, match: _Match, memory_limit: int | None = None) -> Classification:
    line = _line_at(text, match.start)
    fields: dict[str, float | int | str] = {"source": match.source, "device": "cpu"}
    # Under the run's address-space limit an allocation fails at the limit, not for want of the
    # host's memory: a user with gigabytes free is told which of the two it was.
    exhausted = _EXHAUSTED
    if memory_limit:
        exhausted = f"the run's memory limit ({format_size(memory_limit)} of address space) reached"
    if match.source == "cpu_allocator":
        m = _RE_CPU_REQUESTED.search(line)
        if m is not None:
            fields["requested"] = int(m.group(1))
            reason = f"host allocator could not allocate {format_size(int(m.group(1)))}: {exhausted}"
        else:
            reason = f"host allocator could not allocate memory: {exhausted}"
    elif match.source == "dataloader_killed":
        pid = re.search(r"\(pid\(?s?\)? ?(\d+)\)", line)
        if pid is not None:
            fields["pid"] = int(pid.group(1))
        # The kernel's OOM killer: the host's (or the cgroup's) memory, never the address-space limit.
        reason = f"a DataLoader worker was killed (SIGKILL, the kernel's OOM killer): {_EXHAUSTED}"
    elif match.source == "enomem":
        reason = f"the system refused memory (ENOMEM): {exhausted}"
    else:
        reason = f"Python raised MemoryError: {exhausted}"
    return Classification("host_oom", line, fields, reason)


_EXHAUSTED = "host memory exhausted"


def _killed_by_sigkill(exit_code: int | None, signal: int | None) -> bool:
    # 137 is the shell's 128 + 9; -9 is what subprocess reports for a signal death.
    return signal == SIGKILL or exit_code in (137, -SIGKILL)


def classify_text(
    text: str,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    oom_kill: bool | None = None,
    capacity: int | None = None,
    memory_pressure: bool | None = None,
    memory_limit: int | None = None,
) -> Classification:
    """Classify a failure from its error text (stderr, a traceback) and how the process ended.

    `oom_kill` is True when the cgroup's `oom_kill` counter grew during the attempt (see
    `read_oom_kill_count`). `capacity` is the card's memory in bytes, used to spot a request
    larger than the card when the message does not say the total. `memory_pressure` is True when
    the daemon's samples showed the card nearly full at the failure: the evidence that turns an
    ambiguous cuDNN NOT_SUPPORTED into an out-of-memory. `memory_limit` is the run's address-space
    limit, where it has one: a host allocation's failure is then said to be at that limit.
    """
    killed = _killed_by_sigkill(exit_code, signal)
    if killed and oom_kill:
        # The kernel's kill is the last thing that happened, whatever the log said before it.
        return Classification(
            "host_oom",
            "",
            {"source": "sigkill", "device": "cpu", "exit_code": _signal_exit_code(exit_code)},
            "killed by SIGKILL and the cgroup's oom_kill counter grew: host memory exhausted",
        )
    matches = _find_matches(text)
    from_message = _from_oom_message(text, matches, capacity, memory_pressure, memory_limit)
    if from_message is not None:
        return from_message
    return _without_oom_message(text, matches, exit_code=exit_code, killed=killed, oom_kill=oom_kill)


def _signal_exit_code(exit_code: int | None) -> int:
    return exit_code if exit_code is not None else -SIGKILL


def _from_oom_message(
    text: str,
    matches: list[_Match],
    capacity: int | None,
    memory_pressure: bool | None,
    memory_limit: int | None = None,
) -> Classification | None:
    """The out-of-memory message that ended the run, classified; None when none is to be trusted.

    An ambiguous cuDNN NOT_SUPPORTED counts only beside a definite message or memory pressure.
    """
    definite = [m for m in matches if m.family != "ambiguous"]
    ambiguous_ok = memory_pressure is True or bool(definite)
    usable = [m for m in matches if m.family != "ambiguous" or ambiguous_ok]
    if not usable:
        return None
    chosen = _last_line_match(usable, text)
    if chosen.family == "host":
        return _classify_host(text, chosen, memory_limit)
    if chosen.family == "ambiguous" and definite:
        # The numbers, if any, come from the last real allocator message before it.
        numbers_from = max(definite, key=lambda m: m.start)
        start = text.rfind("\n", 0, numbers_from.start) + 1
        return _classify_gpu(text, chosen, capacity, text[start : start + DETAIL_WINDOW_CHARS])
    return _classify_gpu(text, chosen, capacity)


def _without_oom_message(
    text: str, matches: list[_Match], *, exit_code: int | None, killed: bool, oom_kill: bool | None
) -> Classification:
    """No message to trust: the cgroup's counter, a known other failure, a cuDNN NOT_SUPPORTED
    without pressure, or a bare SIGKILL decide, in that order."""
    if oom_kill:
        return Classification(
            "host_oom",
            "",
            {"source": "cgroup_oom_kill", "device": "cpu"},
            "the cgroup's oom_kill counter grew during the attempt: host memory exhausted",
        )
    for pattern, why in _NOT_OOM_SIGNALS:
        found = list(pattern.finditer(text))
        if found:
            return Classification("not_oom", _line_at(text, found[-1].start()), {"source": "not_oom"}, why)
    if matches:
        return Classification(
            "not_oom",
            _line_at(text, matches[-1].start),
            {"source": "cudnn_not_supported"},
            "cuDNN NOT_SUPPORTED without other evidence of memory pressure: not treated as out of memory",
        )
    if killed:
        return Classification(
            "not_oom",
            "",
            {"source": "sigkill", "exit_code": _signal_exit_code(exit_code)},
            "killed by SIGKILL; no OOM-killer evidence",
        )
    return Classification("not_oom", "", {}, "no out-of-memory signal in the error text")


# ---------------------------------------------------------------------------------- exceptions

_GPU_OOM_TYPES = frozenset(
    {
        "torch.OutOfMemoryError",
        "torch.cuda.OutOfMemoryError",
        "torch.cuda.memory.OutOfMemoryError",
        "torch._C.OutOfMemoryError",
        "torch._C._OutOfMemoryError",
    }
)


def _qualified_names(exc: BaseException) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__]


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, most recent first; cycles are cut."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ if current.__cause__ is not None else current.__context__
    return chain


def _exception_text(exc: BaseException) -> str:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{name}: {exc}"


def classify_exception(exc: BaseException, *, capacity: int | None = None) -> Classification:
    """Classify an exception raised in a runner: its type first, its text second.

    The `__cause__`/`__context__` chain is walked from the most recent exception back, so an
    OutOfMemoryError wrapped in a library's own error is still found.
    """
    chain = _exception_chain(exc)
    for item in chain:
        names = _qualified_names(item)
        if any(n in _GPU_OOM_TYPES for n in names):
            text = _exception_text(item)
            matches = [m for m in _find_matches(text) if m.family == "gpu"]
            if matches:
                return _classify_gpu(text, _last_line_match(matches, text), capacity)
            fields: dict[str, float | int | str] = {"source": "exception_type", "device": "cuda"}
            verdict, reason = _gpu_verdict(fields, capacity)
            return Classification(verdict, _line_at(text, 0), fields, f"{names[0]}: {reason}")
        if "builtins.MemoryError" in names:
            return Classification(
                "host_oom",
                _line_at(_exception_text(item), 0),
                {"source": "memory_error", "device": "cpu"},
                "Python raised MemoryError: host memory exhausted",
            )
    # Oldest first, so that the most recent exception is the last match in the text.
    text = "\n".join(_exception_text(item) for item in reversed(chain))
    return classify_text(text, capacity=capacity)


# -------------------------------------------------------------------------------------- cgroup


def cgroup_dir_of(
    pid: int | None = None, *, proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")
) -> Path | None:
    """The cgroup v2 directory of `pid` (default: this process), or None without cgroup v2."""
    target = proc / (str(pid) if pid is not None else "self") / "cgroup"
    try:
        lines = target.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        # cgroup v2 is the single "0::/path" line; v1 hierarchies have a controller name.
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return None


def read_oom_kill_count(cgroup_dir: Path | None = None) -> int | None:
    """The `oom_kill` counter of a cgroup v2 `memory.events` (default: this process's cgroup).

    The count is hierarchical, so kills in child cgroups are included. None where cgroup v2 or
    the memory controller is not available or the file is not readable: SIGKILL is then not
    proof of an out-of-memory kill. The daemon reads it before and after an attempt.
    """
    directory = cgroup_dir if cgroup_dir is not None else cgroup_dir_of()
    if directory is None:
        return None
    try:
        text = (directory / "memory.events").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def oom_kill_grew(before: int | None, after: int | None) -> bool | None:
    """Whether the counter grew between two readings; None when either reading is missing."""
    if before is None or after is None:
        return None
    return after > before


__all__ = [
    "RETUNABLE",
    "VERDICTS",
    "Classification",
    "Verdict",
    "cgroup_dir_of",
    "classify_exception",
    "classify_text",
    "format_size",
    "oom_kill_grew",
    "parse_size",
    "read_oom_kill_count",
]
