"""How a submit was sent: the client's key for it, and how long the client waits for the answer.

A client that gives up on a submit (its wait ran out) must not find the run started later, and a
client that sends it again must not get two runs. So the daemon queues a submit only before the
deadline the client sent, and a submit sent again with the same key answers the run the first one
queued. The key is the client's (a fresh random one per submit, as `Idempotency-Key` is in HTTP).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from gpuwarden.core.errors import UserError

# The request headers, shared by the daemon and its client.
KEY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "X-Gpuwarden-Deadline"
KEY_PATTERN = r"^[A-Za-z0-9_.:-]{8,128}$"


@dataclass(frozen=True)
class Submission:
    """A submit's key (None: the client sent none), the digest of what it asked for, and the
    time (seconds since the epoch) after which it must not be queued (None: no limit).

    The deadline is the client's clock, not a wait counted from the request's arrival: a request
    can sit unread in the socket while the daemon is stopped or swamped, and be read after the
    client gave up. Client and daemon share the machine's clock."""

    key: str | None
    digest: str
    deadline: float | None = None

    @classmethod
    def of(cls, body: bytes | str, key: str | None, deadline: float | None) -> Submission:
        data = body.encode() if isinstance(body, str) else body
        return cls(key, hashlib.sha256(data).hexdigest(), deadline)

    def late_by(self) -> float:
        """Seconds since the client stopped waiting (≤ 0: it still waits, or set no deadline)."""
        return 0.0 if self.deadline is None else time.time() - self.deadline

    def check_in_time(self) -> None:
        """Refuse (code `deadline`) once the client's wait is over: it has said it failed."""
        late = self.late_by()
        if late > 0:
            raise UserError(
                f"the submit could not be queued before the client stopped waiting for it "
                f"({DEADLINE_HEADER}, {late:.1f} s ago): nothing was queued — send it again",
                code="deadline",
            )


@dataclass(frozen=True)
class SubmittedRun:
    """The run a submit with a given key queued, and the digest of that submit."""

    run_id: str
    digest: str

    def check_same(self, submission: Submission) -> None:
        """Refuse one key sent with two different requests: the answer would be another run."""
        if submission.digest != self.digest:
            raise UserError(
                f"{KEY_HEADER} {submission.key} was sent before with another request (it queued run "
                f"{self.run_id}) — send a new key with each submit",
                code="key_reused",
            )
