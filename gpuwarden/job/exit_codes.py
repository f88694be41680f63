"""How `gpuwarden exec` ends, the whole interface an engine needs (Slurm's requeue, a Kubernetes
Job's `podFailurePolicy`, SkyPilot's `recover_on_exit_codes`, a Ray job's retry loop)."""

from __future__ import annotations

SUCCEEDED = 0
FAILED = 1
# A refusal before anything ran (a bad spec, a missing file, a run folder another exec holds):
# the CLI's one-line error status. Restarting the same command changes nothing.
REFUSED = 2
# Stopped at a checkpoint (a time limit's warning, a preemption, an interruption): start the same
# `gpuwarden exec --run DIR` again, in this allocation or a new one, and the run goes on from
# there with every retune kept. EX_TEMPFAIL from sysexits.h: "try again later".
RESTART = 75
