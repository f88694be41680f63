"""`gpuwarden logs RUN -f` follows a run through every attempt: started while the first attempt
runs, it prints the next attempt's output after the retune and returns when the run has ended
(tests/job/test_logs_follow_runs.py: the same from the run folders `gpuwarden exec` keeps)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle, wait_for

# Attempt 1 says which attempt it is, waits for the gate, then fails as PyTorch's allocator does;
# the retune halves the micro-batch (doubling the accumulation) and attempt 2 finishes.
PROGRAM = """
import os, sys, time
from pathlib import Path
attempt = os.environ["GPUWARDEN_ATTEMPT"]
print(f"output of attempt {attempt} at micro-batch {sys.argv[1]}", flush=True)
if attempt == "1":
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
    sys.stderr.write(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 1.20 GiB is free.\\n"
    )
    sys.exit(1)
print("the end of attempt 2", flush=True)
"""


def retuned_spec(root: Path, gate: Path) -> Path:
    program = root / "train.py"
    program.write_text(textwrap.dedent(PROGRAM))
    spec = root / "retuned.yaml"
    spec.write_text(
        "name: retuned\nkind: command\nresources: {gpus: 1}\n"
        f'command:\n  argv: ["{sys.executable}", "{program}", "{{bs}}", "{gate}", "{{acc}}"]\n'
        "  roles: {micro_batch: bs, accum_steps: acc}\n"
        "knobs: {bs: 32, acc: 1}\n"
    )
    return spec


class Follower:
    """`gpuwarden logs … -f` running: its stdout read on a thread, so a test can wait for what it
    has printed; its stderr in a file."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.stdout = ""
        self._stderr = cwd / "logs-follow-stderr.txt"
        with self._stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden", "logs", *args, "-f"],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout += line

    def ended(self, timeout: float = 120) -> tuple[int, str, str]:
        """Its exit status, stdout and stderr once it has returned (by itself)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code, self.stdout, self._stderr.read_text()


def assert_followed_to_the_end(follower: Follower) -> None:
    code, out, err = follower.ended()
    assert code == 0, err
    assert out.startswith("output of attempt 1 at micro-batch 32\n"), out
    assert "output of attempt 2 at micro-batch 16\nthe end of attempt 2\n" in out, out
    (header,) = [line for line in err.splitlines() if "attempt 2" in line]
    assert header.startswith("── attempt 2") and "micro-batch 32 → 16" in header, err


@pytest.mark.slow
def test_logs_follow_goes_on_through_the_retune_to_the_runs_end(gw: DaemonHandle) -> None:
    gate = gw.root / "gate"
    spec = retuned_spec(gw.root, gate)
    submitted = gw.cli("run", str(spec), "--json")
    assert submitted.returncode == 0, submitted.stderr
    gw.wait_state("retuned", ("running",))
    follower = Follower(["retuned"], gw.env, gw.root)
    wait_for(lambda: "output of attempt 1" in follower.stdout, "attempt 1's output in logs -f")
    gate.touch()
    assert_followed_to_the_end(follower)
    detail: dict[str, Any] = gw.cli_json("show", "retuned")
    assert detail["state"] == "succeeded" and len(detail["attempts"]) == 2
