"""A `RunReader` on one host of a fleet: `show` and `logs` read a run on the host that owns it
with the code they read a local run with."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.client.hosts import Fleet, HostLink
from gpuwarden.core.api import EventsPage, LogChunk, RunDetail, RunSummary
from gpuwarden.core.errors import UserError


class HostReader:
    """Runs, events and logs of one host, through its link (opened again after it broke)."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self.host = link.name

    def runs(self, states: Sequence[str] = ()) -> list[RunSummary]:
        return self.link.call(lambda c: c.runs(states))

    def run(self, ref: str) -> RunDetail:
        return self.link.call(lambda c: c.run(ref))

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> EventsPage:
        return self.link.call(lambda c: c.events(ref, since=since, limit=limit, wait=wait))

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> LogChunk:
        return self.link.call(
            lambda c: c.logs(ref, stream=stream, attempt=attempt, offset=offset, limit=limit, wait=wait)
        )


def owner_of(fleet: Fleet, ref: str) -> HostReader:
    """The reader of the one host whose daemon knows run `ref`; UserError naming what each host
    said when none does, or the hosts when several do."""
    answers = fleet.each(lambda c: c.run(ref).id)
    owners = [a for a in answers if a.ok]
    if len(owners) > 1:
        where = ", ".join(f"{a.host} ({a.value})" for a in owners)
        raise UserError(f"{ref} names runs on several hosts: {where} — give one --host", code="ambiguous")
    if not owners:
        said = "; ".join(f"{a.host}: {'not there' if a.code == 'not_found' else a.error}" for a in answers)
        code = "not_found" if all(a.code == "not_found" for a in answers) else "hosts"
        raise UserError(f"no host has run {ref} ({said})", code=code)
    return HostReader(next(link for link in fleet.links if link.name == owners[0].host))
