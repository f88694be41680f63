"""Parsing a Server-Sent Events byte stream into frames."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StreamFrame:
    """One SSE message: `event` is the frame kind (sample, run, event), `data` its JSON body."""

    event: str
    data: dict[str, Any]
    id: str | None = None

    @property
    def dropped(self) -> int:
        """Frames the daemon dropped for this client so far (it was reading too slowly)."""
        value = self.data.get("dropped", 0)
        return int(value) if isinstance(value, int) else 0


def parse_sse(lines: Iterable[str]) -> Iterator[StreamFrame]:
    """Frames from SSE text lines; comments (keep-alives) and unparsable data are skipped."""
    event, frame_id = "message", None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                try:
                    body = json.loads("\n".join(data))
                except ValueError:
                    body = None
                if isinstance(body, dict):
                    yield StreamFrame(event, body, frame_id)
            event, data, frame_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            frame_id = value
