"""Where doctor/report/compare read runs from: `--db PATH` (read-only), else the running daemon."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpuwarden.client import ApiClient
from gpuwarden.core.api import HistoryAnswer, RunDetail
from gpuwarden.core.errors import UserError
from gpuwarden.core.report.data import Point, RunData, Series
from gpuwarden.core.report.db_data import DbRunData

NOT_RUNNING = "the daemon is not running — start it with `gpuwarden up`, or pass --db PATH"
EVENT_PAGE = 10_000  # the API's largest page


def _series(answer: HistoryAnswer | None, key: str, metrics: list[str]) -> Series:
    found = answer.series.get(key, {}) if answer is not None else {}
    out: Series = {}
    for metric in metrics:
        points: list[Point] = [
            (float(p[0]), float(p[1]), float(p[2]), float(p[3])) for p in found.get(metric, [])
        ]
        out[metric] = points
    return out


class ApiRunData:
    """`RunData` over the daemon's HTTP API (the same answers as the database, tested so).

    The analysis above `RunData` reads plain records, as the database gives them: the API's
    models are handed over as their JSON documents."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self._details: dict[str, RunDetail] = {}

    @property
    def source(self) -> str:
        return "daemon"

    def resolve_run(self, ref: str) -> dict[str, Any]:
        detail = self.client.run(ref)
        self._details[detail.id] = detail
        return detail.model_dump(mode="json")

    def _detail(self, run_id: str) -> RunDetail:
        if run_id not in self._details:
            self.resolve_run(run_id)
        return self._details[run_id]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return [a.model_dump(mode="json") for a in self._detail(run_id).attempts]

    def retunes(self, run_id: str) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") for r in self._detail(run_id).retunes]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        since = 0
        while True:
            page = self.client.events(run_id, since=since, limit=EVENT_PAGE)
            out += [e.model_dump(mode="json") for e in page.events]
            if len(page.events) < EVENT_PAGE:
                return out
            since = page.next_since

    def gpu_info(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(g) for g in self.client.gpus().gpus]

    def _history(
        self, metrics: list[str], start: float, end: float, points: int, **kw: Any
    ) -> HistoryAnswer | None:
        try:
            # microsecond precision: the daemon rebuilds start = end - window, and a rounded window
            # would shift every bucket edge against what the database path computes
            return self.client.history(
                window=f"{end - start:.6f}s", metrics=metrics, points=points, end=end, **kw
            )
        except UserError as exc:
            if exc.code == "not_found":  # a GPU the daemon's store never recorded
                return None
            raise

    def gpu_series(self, uuid: str, metrics: list[str], start: float, end: float, points: int) -> Series:
        if end <= start:
            return {m: [] for m in metrics}
        return _series(self._history(metrics, start, end, points, gpus=[uuid]), uuid, metrics)

    def host_series(self, metrics: list[str], start: float, end: float, points: int) -> Series:
        if end <= start:
            return {m: [] for m in metrics}
        return _series(self._history(metrics, start, end, points, host=True), "host", metrics)

    def energy(self, uuid: str, start: float, end: float) -> float | None:
        """Sum of the per-bucket energy the history query returns over the window."""
        if end <= start:
            return None
        points = max(1, min(5000, int(end - start) + 1))
        buckets = self.gpu_series(uuid, ["energy_j"], start, end, points)["energy_j"]
        return sum(p[1] for p in buckets) if buckets else None

    def processes(self, uuid: str, start: float, end: float) -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = []
        seen: set[tuple[Any, ...]] = set()
        since = start
        while True:
            answer = self.client.process_history(since, end, gpu=uuid)
            kept = answer.kept_since
            if kept is None or end <= kept:
                return None  # retention dropped the reads of this window (or none was ever stored)
            page = answer.processes
            for process in page:
                key = (process.ts, process.pid, process.kind)
                if key not in seen:
                    seen.add(key)
                    rows.append(process.to_dict())
            # A cut answer goes on from its newest read (rows of that read may repeat: skipped).
            if not answer.truncated or not page or page[-1].ts <= since:
                return rows
            since = page[-1].ts

    def close(self) -> None:
        self.client.close()


def open_run_data(db: Path | None) -> RunData:
    """`--db PATH` when given, else the daemon; a one-line error when neither is there."""
    if db is not None:
        return DbRunData(db)
    client = ApiClient()
    try:
        client.check_version()
    except UserError as exc:
        client.close()
        if exc.code == "not_running":
            raise UserError(NOT_RUNNING, code="not_running") from None
        raise
    return ApiRunData(client)
