"""`gpuwarden doctor`: findings about a run spec (static checks) and a run's telemetry, with fixes."""
