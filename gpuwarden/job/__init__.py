"""`gpuwarden exec`: one run supervised in the foreground inside a cluster job, with no daemon."""
