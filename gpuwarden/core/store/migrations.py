"""The ordered list of schema migrations. Append only: never edit a released migration."""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

from gpuwarden.core.store import (
    schema_energy,
    schema_environment,
    schema_gang,
    schema_runs,
    schema_submissions,
    schema_telemetry,
)

Migration = tuple[int, str, Callable[[sqlite_utils.Database], None]]

MIGRATIONS: list[Migration] = [
    (1, "telemetry: gpus, samples, rollups, processes, host", schema_telemetry.migrate_v1),
    (2, "runs: runs, attempts, events, retunes, metrics", schema_runs.migrate_v2),
    (3, "gangs: attempts.world_size, an events offset per rank", schema_gang.migrate_v3),
    (4, "runs: the environment each was submitted with", schema_environment.migrate_v4),
    (5, "runs: the key each was submitted with", schema_submissions.migrate_v5),
    (6, "runs: energy counters read at each attempt's start and end", schema_energy.migrate_v6),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]
