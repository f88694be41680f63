"""Where each host's daemon listens, remembered between commands (`<runtime>/ssh/sockets.json`,
owner-only): asking `gpuwarden status --socket` there starts a Python on the host, the
largest part of reaching it. A remembered path is only a first guess: when no daemon answers on
it, the host is asked again (its settings may have moved the socket)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from gpuwarden.core.private import write_private_text

MAX_BYTES = 64 * 1024  # a few hundred hosts; a larger file is not ours to read whole


class RemoteSockets:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _read(self) -> dict[str, str]:
        try:
            with self.path.open("rb") as f:
                data = json.loads(f.read(MAX_BYTES + 1)[:MAX_BYTES] or b"{}")
        except (OSError, ValueError):
            return {}  # none yet, or damaged: the hosts are asked, and it is written anew
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def get(self, host: str) -> Path | None:
        with self._lock:
            known = self._read().get(host)
        return Path(known) if known and known.startswith("/") else None

    def put(self, host: str, socket: Path | None) -> None:
        """Remember `socket` for `host` (None: forget it)."""
        with self._lock:
            known = self._read()
            if socket is None:
                known.pop(host, None)
            else:
                known[host] = str(socket)
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            try:
                write_private_text(partial, json.dumps(known, indent=1))
                partial.replace(self.path)
            except OSError:
                partial.unlink(missing_ok=True)  # a guess not kept costs a question next time
