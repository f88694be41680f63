"""One notification: what happened, to which run on which host, as a title and a body, and as the
JSON document and environment variables a `notify.on_event` command gets."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Notice:
    """A message for every target. `event` is one of `notify.events` (or `test`)."""

    event: str
    title: str
    body: str
    host: str
    ts: float
    run_id: str | None = None
    run_name: str | None = None
    attempt: int | None = None
    gpu: str | None = None  # a GPU condition's GPU: "0 (GPU-…)"
    details: dict[str, Any] = field(default_factory=dict)  # the event's own fields

    def document(self) -> dict[str, Any]:
        """What a command reads on stdin (and what `--json` shows of a test message)."""
        return asdict(self)

    def json(self) -> str:
        return json.dumps(self.document(), default=str, separators=(",", ":"))

    def environment(self) -> dict[str, str]:
        """The same facts as variables, for a command that would rather not parse JSON (empty
        where the notice has none, so a variable is never left over from the caller's environment)."""
        values = {
            "EVENT": self.event,
            "RUN": self.run_id,
            "RUN_NAME": self.run_name,
            "ATTEMPT": None if self.attempt is None else str(self.attempt),
            "HOST": self.host,
            "GPU": self.gpu,
            "TITLE": self.title,
            "BODY": self.body,
        }
        return {f"GPUWARDEN_{name}": value or "" for name, value in values.items()}

    def with_body(self, body: str) -> Notice:
        return Notice(**{**asdict(self), "body": body})
