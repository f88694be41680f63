"""What a run prints reaches its log as it prints it, and `run --follow` prints stdout and
stderr in the order the program wrote them (as far as the two files can tell)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.daemon.conftest import DaemonHandle, wait_for

# Prints a line without flushing, then waits for the gate: a block-buffered stdout keeps the line
# in the program until it ends.
WAITS = """
import sys, time
from pathlib import Path
print("step 1 done")
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""

# A warning on stderr, a moment later the result on stdout, then the end: one poll of the
# follower usually sees both, and the warning must still come first.
ORDERED = """
import sys, time
sys.stderr.write("warning: first\\n")
time.sleep(0.2)
print("then the result")
"""


def _script(root: Path, name: str, body: str) -> Path:
    path = root / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_python_script_output_reaches_its_log_while_it_runs(gw: DaemonHandle) -> None:
    gate = gw.root / "gate"
    program = _script(gw.root, "waits.py", WAITS)
    # A shell as most users have it: this one may have set PYTHONUNBUFFERED itself.
    shell = {k: v for k, v in gw.env.items() if k != "PYTHONUNBUFFERED"}
    argv = [sys.executable, str(program), str(gate)]
    submitted = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "run", "--json", "--gpus", "0", "--", *argv],
        env=shell,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=gw.root,
    )
    assert submitted.returncode == 0, submitted.stderr
    run = json.loads(submitted.stdout)
    try:
        wait_for(
            lambda: "step 1 done" in gw.cli("logs", run["id"]).stdout,
            timeout=60,
            what="the printed line in the log before the program ends",
        )
    finally:
        gate.touch()
    wait_for(lambda: gw.cli_json("show", run["id"])["state"] == "succeeded", timeout=60, what="the run's end")


def test_the_spec_can_turn_unbuffered_output_off(gw: DaemonHandle) -> None:
    probe = "import os; print(repr(os.environ.get('PYTHONUNBUFFERED')))"
    spec = gw.write_spec(
        "buffered.yaml",
        "name: buffered\nkind: command\nresources: {gpus: 0}\nenv: {PYTHONUNBUFFERED: ''}\n"
        f"command:\n  argv: [{sys.executable!r}, -c, {probe!r}]\n",
    )
    done = gw.cli("run", str(spec), "--follow")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "''", done.stdout


def test_follow_prints_the_streams_in_the_order_they_were_written(gw: DaemonHandle) -> None:
    program = _script(gw.root, "ordered.py", ORDERED)
    both = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "run",
            "--gpus",
            "0",
            "--follow",
            "--",
            sys.executable,
            str(program),
        ],
        env=gw.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        cwd=gw.root,
    )
    assert both.returncode == 0, both.stdout
    lines = [line for line in both.stdout.splitlines() if line in ("warning: first", "then the result")]
    assert lines == ["warning: first", "then the result"], both.stdout


# Runs out of memory (its message on stderr) at batch 16, then prints its result at batch 8.
FAILS_THEN_RUNS = """
import sys
batch = int(sys.argv[1])
print(f"starting at batch {batch}", flush=True)
if batch > 8:
    sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                     "total capacity of 79.10 GiB of which 1.20 GiB is free.\\n")
    sys.exit(1)
print("the result", flush=True)
"""


def test_follow_prints_what_an_attempt_wrote_before_the_line_that_says_it_ended(gw: DaemonHandle) -> None:
    program = _script(gw.root, "fails_then_runs.py", FAILS_THEN_RUNS)
    both = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "run", "--knob", "bs=16", "--role", "micro_batch=bs", "--follow",
         "--", sys.executable, str(program), "{bs}"],
        env=gw.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=gw.root,
    )  # fmt: skip
    assert both.returncode == 0, both.stdout
    lines = both.stdout.splitlines()

    def at(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert at("starting at batch 16") < at("CUDA out of memory") < at("state: retuning"), both.stdout
    assert at("state: retuning") < at("starting at batch 8") < at("the result") < at("state: succeeded"), (
        both.stdout
    )
