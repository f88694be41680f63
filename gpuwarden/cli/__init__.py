"""Command-line entry points. Commands import their heavy parts lazily so `gpuwarden --help`
and the daemon start fast and the daemon never loads torch or textual."""
