"""Remembered tuning results, one JSON file per fingerprint under the state directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class TuneCache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, fp: str) -> Path:
        return self.directory / f"{fp}.json"

    def get(self, fp: str) -> dict[str, Any] | None:
        """The stored entry, or None; an unreadable entry is treated as absent (and re-tuned)."""
        try:
            data = json.loads(self._path(fp).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("fingerprint") == fp else None

    def put(self, fp: str, inputs: dict[str, Any], result: dict[str, Any], knobs: dict[str, Any]) -> Path:
        """Store atomically (temp file + rename) so a crash never leaves half an entry."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {
            "fingerprint": fp,
            "created": time.time(),
            "inputs": inputs,
            "knobs": knobs,
            "result": result,
        }
        path = self._path(fp)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry, indent=2, default=str))
        os.replace(tmp, path)
        return path
