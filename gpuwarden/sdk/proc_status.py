"""A size from /proc/self/status (Linux): what an address-space limit counts (VmSize, VmPeak).

Standard library only, as the SDK's reporter is: read by the reporter, the fixed-memory measure
and the built-in runners alike.
"""

from __future__ import annotations


def status_bytes(field: str) -> int | None:
    """`field` of /proc/self/status (`VmPeak`, `VmSize` …) in bytes; None where there is none."""
    prefix = f"{field}:"
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(prefix):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


__all__ = ["status_bytes"]
