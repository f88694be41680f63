"""SQLite store (sqlite-utils): telemetry samples with rollups, and the runs the daemon supervises."""
