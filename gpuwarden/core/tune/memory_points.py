"""Memory points remembered per shape: the (micro-batch, peak) pairs a retune's probes measured,
one JSON file per fingerprint next to the tuning results.

The fingerprint is the tuning cache's (model, shapes, effective batch, libraries), with the
memory that ran out in place of the device: the same run under the same limit or card peaks the
same, so the next time it runs out of memory the retune decides from these without probing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.private import ensure_private_dir, write_private_text
from gpuwarden.core.safeload import read_json_file
from gpuwarden.core.tune.fingerprint import fingerprint, fingerprint_inputs

# Sizes kept per shape at most: a file stays a few hundred bytes whatever a run does.
MAX_SIZES = 16


def memory_key(spec: RunSpec, on_gpu: bool, capacity: int | None) -> str | None:
    """The fingerprint of the run's shape under this memory; None where the memory is unknown."""
    if capacity is None or capacity <= 0:
        return None
    device = {"memory": "gpu" if on_gpu else "host", "capacity": int(capacity)}
    return fingerprint(fingerprint_inputs(spec, device))


class MemoryPoints:
    """Remembered (micro-batch, worst peak) pairs, by `memory_key`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> list[tuple[int, int]]:
        """The remembered points; none where the file is missing or unreadable."""
        try:
            data = read_json_file(self._path(key), what="remembered memory points")
        except UserError:
            return []
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("points"), list):
            return []
        return [
            (int(p[0]), int(p[1]))
            for p in data["points"]
            if isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and v > 0 for v in p)
        ]

    def add(self, key: str, points: Iterable[tuple[int, int]]) -> None:
        """Merge `points` in (the worst peak per micro-batch), atomically: temp file + rename."""
        merged = dict(self.get(key))
        for batch, peak in points:
            if batch > 0 and peak > 0:
                merged[batch] = max(merged.get(batch, 0), peak)
        if not merged:
            return
        kept = sorted(merged.items())[-MAX_SIZES:]
        ensure_private_dir(self.directory)
        entry = {"key": key, "updated": time.time(), "points": [list(p) for p in kept]}
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_private_text(tmp, json.dumps(entry))
        os.replace(tmp, path)
