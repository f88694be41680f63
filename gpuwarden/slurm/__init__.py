"""Slurm: running a command as a batch job, and what that job sees of Slurm.

Two sides, as in submitit: the submitter's (`sbatch.py` writes the batch script, `scheduler.py`
submits, watches, cancels) and the job's (`environment.py`: the job's own id, nodes and restart
count, and asking to be requeued after a checkpoint). Everything goes through Slurm's own
commands (`sbatch`, `squeue`, `scontrol`, `scancel`) with a bound on their time; nothing here
imports more of gpuwarden than its core.
"""
