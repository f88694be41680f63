"""Remembered tuning results, one JSON file per fingerprint under the state directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpuwarden.core.errors import UserError
from gpuwarden.core.private import ensure_private_dir, write_private_text
from gpuwarden.core.safeload import read_json_file


class TuneCache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, fp: str) -> Path:
        return self.directory / f"{fp}.json"

    def get(self, fp: str) -> dict[str, Any] | None:
        """The stored entry, or None; an unreadable entry is treated as absent (and re-tuned), and
        so is an uncertain one: noise could have made its pick, so the next tune measures again."""
        try:
            data = read_json_file(self._path(fp), what="tuning result")
        except UserError:
            return None
        if not isinstance(data, dict) or data.get("fingerprint") != fp or data.get("uncertain"):
            return None
        return data

    def put(
        self,
        fp: str,
        inputs: dict[str, Any],
        result: dict[str, Any],
        knobs: dict[str, Any],
        *,
        uncertain: bool = False,
    ) -> Path:
        """Store atomically (temp file + rename) so a crash never leaves half an entry. An
        uncertain result is stored too (it replaces an older answer, and says what was seen) but
        `get` does not return it."""
        ensure_private_dir(self.directory)
        entry = {
            "fingerprint": fp,
            "uncertain": uncertain,
            "created": time.time(),
            "inputs": inputs,
            "knobs": knobs,
            "result": result,
        }
        path = self._path(fp)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        write_private_text(tmp, json.dumps(entry, indent=2, default=str))
        os.replace(tmp, path)
        return path
