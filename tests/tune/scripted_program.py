"""A user's own program whose throughput the test chooses, reading by reading.

The probe of an own program reads samples/s from the times of its progress events; this program
writes them with the rate the test gave for its micro-batch and the how-manieth run it is, so the
noise of every reading is the test's, whatever the machine's load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROGRAM = """\
import json, os, sys, time
from pathlib import Path

bs, acc, steps, rates_file = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[5])
count = rates_file.with_name(f"read-{bs}")
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
rates = json.loads(rates_file.read_text())[str(bs)]
rate = rates[min(n, len(rates) - 1)]
start = time.time()
with open(os.environ["GPUWARDEN_EVENTS_FILE"], "a") as events:
    for step in range(1, steps + 1):
        seen = step * bs * acc
        events.write(json.dumps({"v": 1, "type": "progress", "ts": start + seen / rate, "step": step,
                                 "samples_seen": seen}) + "\\n")
"""


def scripted_spec(folder: Path, rates: dict[int, list[float]], *, extra: str = "") -> Path:
    """`own.yaml` in `folder`: the program at micro-batch 1 × accumulation 4 (effective batch 4),
    reading `rates[micro-batch]` in turn (the last one repeats); `extra` adds top-level keys."""
    (folder / "train.py").write_text(PROGRAM)
    (folder / "rates.json").write_text(json.dumps(rates))
    for old in folder.glob("read-*"):
        old.unlink()  # the readings start from the first again
    argv = f'["{sys.executable}", train.py, "{{bs}}", "{{acc}}", "{{steps}}", "{{out}}", rates.json]'
    roles = "{micro_batch: bs, accum_steps: acc, max_steps: steps, output_dir: out}"
    spec = folder / "own.yaml"
    spec.write_text(
        f"name: own\nkind: command\n{extra}resources: {{gpus: 0}}\ncommand:\n  cwd: {folder}\n"
        f"  argv: {argv}\n  roles: {roles}\nknobs: {{bs: 1, acc: 4, steps: 100, out: o}}\n"
    )
    return spec
