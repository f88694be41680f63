"""The energy counter readings taken at an attempt's start and end, and the joules between them.

Written by the daemon's sampler when the supervisor starts an attempt and when it sees its
process end; read with the attempt, so its energy is the counter's difference, exact whatever
the sampling interval.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Edge = Literal["start", "end"]


@dataclass(frozen=True)
class EnergyReading:
    """One GPU's energy counter (mJ) read at one edge of one attempt."""

    run_id: str
    attempt: int
    gpu: str
    edge: Edge
    ts: float
    energy_mj: int


def add_readings(conn: sqlite3.Connection, readings: Iterable[EnergyReading]) -> None:
    """Store readings; one read again at the same edge (a re-adopted attempt) replaces it."""
    conn.executemany(
        "INSERT OR REPLACE INTO attempt_energy (run_id, attempt, gpu, edge, ts, energy_mj)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(r.run_id, r.attempt, r.gpu, r.edge, r.ts, r.energy_mj) for r in readings],
    )


def counter_joules(conn: sqlite3.Connection, run_id: str) -> dict[int, dict[str, float]]:
    """Attempt → GPU → joules between its start and end readings. A GPU lacking either reading,
    or whose counter went back (the driver reloaded meanwhile), is left out."""
    try:
        rows = conn.execute(
            "SELECT s.attempt, s.gpu, e.energy_mj - s.energy_mj FROM attempt_energy s"
            " JOIN attempt_energy e ON e.run_id = s.run_id AND e.attempt = s.attempt AND e.gpu = s.gpu"
            " AND e.edge = 'end' WHERE s.run_id = ? AND s.edge = 'start'",
            (run_id,),
        ).fetchall()
    except sqlite3.OperationalError:
        return {}  # a database read as an older version left it (opened read-only): no readings
    out: dict[int, dict[str, float]] = {}
    for attempt, gpu, delta_mj in rows:
        if delta_mj >= 0:
            out.setdefault(int(attempt), {})[str(gpu)] = delta_mj / 1000.0
    return out
