"""A gpuwarden run as a Ray job, started again each time it stops at a checkpoint.

The Ray Jobs API runs an entrypoint once and leaves retries to the submitter: this loop is that
submitter. Run it on your own machine; it talks to the cluster's dashboard only:

    pip install 'ray[default]'
    python ray_job.py --address http://HEAD:8265 --run /shared/runs/NAME /shared/specs/NAME.yaml

Every start is the same job, `gpuwarden exec SPEC --run DIR`: the first starts the run in DIR,
each later one takes it up from its last checkpoint with every retune kept. When something stops
the run at a checkpoint (SIGTERM, SIGINT or SIGUSR1 to the exec, e.g. from a preemption notice:
`kill -USR1 $(cut -d' ' -f1 DIR/exec.pid)`), the job's driver exits 75 and the loop submits the
job again, at most --max-starts times in all. It exits 0 once the run has succeeded; otherwise it
says why in one line and exits with the driver's code (1 the run failed, 2 refused: nothing ran,
75 still stopped after --max-starts: run it again to go on), or 1 when the driver left none.

`ray job stop ID` ends the loop, as asked. Ray sends the job SIGTERM, which stops the run at a
checkpoint, and SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default: give a checkpoint its time
with --env RAY_JOB_STOP_WAIT_TIME_S=120).

SPEC and DIR are paths on the cluster: absolute (the job runs in a folder of Ray's) and on a
filesystem every node shares, so any start can run on any node. `--gpus N` has Ray place the job
on a node with N free GPUs and hand them to gpuwarden; without it the job runs on the head node.
`gpuwarden ps|show|logs --runs /shared/runs` reads the run's record from any node.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import PurePosixPath
from typing import Any

from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient

RESTART = 75  # gpuwarden exec: stopped at a checkpoint, start the same command again
WHAT_IT_MEANS = {1: "the run failed", 2: "refused, nothing ran", 127: "not found: see --gpuwarden"}


def exec_entrypoint(spec: str, run_dir: str, gpuwarden: str = "gpuwarden") -> str:
    """The one command every start runs."""
    return f"{gpuwarden} exec {shlex.quote(spec)} --run {shlex.quote(run_dir)}"


def run_to_the_end(
    client: JobSubmissionClient,
    entrypoint: str,
    *,
    max_starts: int = 10,
    runtime_env: dict[str, Any] | None = None,
    gpus: int = 0,
    poll_s: float = 2.0,
) -> int:
    """Submit `entrypoint` until a job of it succeeds, again only after exit 75; this loop's exit code."""
    for start in range(1, max_starts + 1):
        job_id = client.submit_job(
            entrypoint=entrypoint, runtime_env=runtime_env, entrypoint_num_gpus=gpus or None
        )
        print(f"start {start} of {max_starts}: {job_id} (its output: ray job logs {job_id})", flush=True)
        while not (job := client.get_job_info(job_id)).status.is_terminal():
            time.sleep(poll_s)
        code = job.driver_exit_code
        if job.status == JobStatus.SUCCEEDED:
            print(f"{job_id}: the run succeeded", flush=True)
            return 0
        if job.status != JobStatus.FAILED or code != RESTART:
            print(f"ray_job: {job_id} {_why(job)}", file=sys.stderr)
            return code if code is not None and 0 < code < 256 else 1
        print(f"{job_id}: stopped at a checkpoint (exit 75)", flush=True)
    print(f"ray_job: stopped at a checkpoint {max_starts} times: run this again to go on", file=sys.stderr)
    return RESTART


def _why(job: JobDetails) -> str:
    if job.status == JobStatus.STOPPED:
        return "was stopped (ray job stop): run this again to go on from the run's last checkpoint"
    if job.driver_exit_code is not None:
        meaning = WHAT_IT_MEANS.get(job.driver_exit_code, "see its output")
        return f"failed: gpuwarden exec exited {job.driver_exit_code} ({meaning})"
    # No exit code: the driver never ran or its node went (Ray's message says which).
    return f"failed: {(job.message or 'no reason given').splitlines()[0]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", metavar="SPEC.yaml", help="the run's spec, a path on the cluster")
    parser.add_argument("--address", required=True, help="the cluster's dashboard: http://HEAD:8265")
    parser.add_argument("--run", required=True, metavar="DIR", help="the run's folder, a path on the cluster")
    parser.add_argument("--max-starts", type=int, default=10, help="starts in all (default 10)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs Ray gives the job (default: none asked)")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="for gpuwarden (repeat)")
    parser.add_argument("--gpuwarden", default="gpuwarden", help="its command on the cluster")
    args = parser.parse_args(argv)
    if not (PurePosixPath(args.spec).is_absolute() and PurePosixPath(args.run).is_absolute()):
        print("ray_job: SPEC and --run are paths on the cluster: give them absolute", file=sys.stderr)
        return 2
    if bad := [pair for pair in args.env if "=" not in pair]:
        print(f"ray_job: --env {bad[0]}: give KEY=VALUE", file=sys.stderr)
        return 2
    if args.max_starts < 1:
        print("ray_job: --max-starts counts the first start too: give 1 or more", file=sys.stderr)
        return 2
    env = {key: value for key, _, value in (pair.partition("=") for pair in args.env)}
    entrypoint = exec_entrypoint(args.spec, args.run, args.gpuwarden)
    try:
        return run_to_the_end(
            JobSubmissionClient(args.address),
            entrypoint,
            max_starts=args.max_starts,
            runtime_env={"env_vars": env} if env else None,
            gpus=args.gpus,
        )
    except (OSError, RuntimeError) as e:  # Ray out of reach (ConnectionError), or a call refused
        print(f"ray_job: {e}".splitlines()[0], file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # The job is the cluster's, not this loop's: it runs on.
        print("ray_job: interrupted; the Ray job runs on (ray job list shows it)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
