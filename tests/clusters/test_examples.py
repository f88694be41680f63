"""The shipped Kubernetes Job and SkyPilot task say what `gpuwarden exec` means: exit 75 starts
the same command again, 1 and 2 end the job, and the command takes the run up from its folder."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.job import exit_codes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _takes_up_its_folder(argv: list[str]) -> None:
    assert argv[:2] == ["gpuwarden", "exec"], argv
    assert "--run" in argv and argv[argv.index("--run") + 1].startswith("/"), argv


def test_the_kubernetes_job_answers_75_with_a_new_pod_and_fails_on_1_and_2() -> None:
    job = _load("kubernetes-job.yaml")
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    template = job["spec"]["template"]["spec"]
    assert template["restartPolicy"] == "Never"  # podFailurePolicy needs it
    (container,) = template["containers"]
    _takes_up_its_folder(container["command"])
    rules = job["spec"]["podFailurePolicy"]["rules"]
    by_codes = {
        tuple(rule["onExitCodes"]["values"]): rule["action"]
        for rule in rules
        if "onExitCodes" in rule and rule["onExitCodes"]["containerName"] == container["name"]
    }
    assert by_codes[(exit_codes.RESTART,)] == "Ignore"
    assert by_codes[(exit_codes.FAILED, exit_codes.REFUSED)] == "FailJob"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    run_dir = container["command"][container["command"].index("--run") + 1]
    assert any(run_dir.startswith(path + "/") for path in mounts), "the run's folder must be on a volume"


def test_the_skypilot_task_recovers_on_75_only() -> None:
    task = _load("skypilot-task.yaml")
    recovery = task["resources"]["job_recovery"]
    assert recovery["recover_on_exit_codes"] == [exit_codes.RESTART]
    assert recovery["max_restarts_on_errors"] == 0
    argv = shlex.split(task["run"])
    _takes_up_its_folder(argv)
    run_dir = argv[argv.index("--run") + 1]
    assert any(run_dir.startswith(path + "/") for path in task["file_mounts"]), "the folder must be mounted"
