"""Every CPU example in configs/examples runs to `finished` through a real daemon, as a user
would run it: `gpuwarden example-models`, then `gpuwarden run SPEC --follow`, then `show`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonHandle
from tests.daemon.module_daemon import module_daemon

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "configs" / "examples"
# The OOM-recovery examples (ours and users' own scripts) have their own tests, which check more.
CPU_EXAMPLES = sorted(
    p.name
    for p in EXAMPLES.glob("*-cpu.yaml")
    if p.name not in ("oom-recovery-cpu.yaml", "ddp-oom-recovery-cpu.yaml")
    and not p.name.startswith("own-script-")
)


@pytest.fixture(scope="module")
def example_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of configs/examples next to freshly built `.example-models`, laid out like the
    repository so the specs' relative paths (../../.example-models/…) resolve the same way."""
    root = tmp_path_factory.mktemp("examples")
    shutil.copytree(EXAMPLES, root / "configs" / "examples")
    built = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "example-models", str(root / ".example-models"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    # --json is exactly one JSON document; progress bars of the tokenizer trainer stay out of both.
    assert set(json.loads(built.stdout)) >= {"train-lm", "tiny-llm", "prompts", "gang-lm", "gang-texts"}
    assert built.stderr.strip().count("\n") == 0, built.stderr
    return root


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    """One daemon runs every example, as one user's daemon would (each has its own name). Its
    runners use one torch thread: two spin more than they compute on a shared 2-core machine."""
    with module_daemon(tmp_path_factory.mktemp("daemon"), {"OMP_NUM_THREADS": "1"}) as handle:
        yield handle


def test_there_is_a_cpu_example_per_task() -> None:
    assert {"train-causal-lm-cpu.yaml", "train-image-cpu.yaml", "infer-generate-cpu.yaml",
            "infer-image-to-text-cpu.yaml"} <= set(CPU_EXAMPLES)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_EXAMPLES)
def test_example_runs_to_finished_through_the_daemon(gw: DaemonHandle, example_tree: Path, name: str) -> None:
    spec = example_tree / "configs" / "examples" / name
    result = gw.cli("run", str(spec), "--follow", timeout=300)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-3000:]
    assert "finished" in shown
    run_name = next(
        line.split(":", 1)[1].strip() for line in spec.read_text().splitlines() if line.startswith("name:")
    )
    with gw.client() as client:  # what `show --json` prints
        detail = client.run(run_name).model_dump(mode="json")
    assert detail["state"] == "succeeded"
    assert isinstance(detail["report"], dict) and detail["report"]
    human = gw.cli("show", run_name)
    assert "report:" in human.stdout


def test_an_example_submitted_before_its_models_are_built_names_the_command_that_builds_them(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    # The repository's layout before `gpuwarden example-models` ran (or after it ran elsewhere).
    shutil.copytree(EXAMPLES, tmp_path / "configs" / "examples")
    build = f"build the example models first: gpuwarden example-models {tmp_path / '.example-models'}"
    with gw.client() as client:
        runs_before = len(client.runs())
    # A built-in runner's model, and a user's own script that is handed its model as an argument.
    for name, key in (("train-causal-lm-cpu", "train.model"), ("own-script-hf-cpu", "command.argv[3]")):
        result = gw.cli("run", f"configs/examples/{name}.yaml", cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1), result.stderr
        assert result.stderr.startswith(f"gpuwarden: configs/examples/{name}.yaml:"), result.stderr
        assert f": {key}: " in result.stderr and result.stderr.endswith(f" — {build}\n"), result.stderr
        assert "/../" not in result.stderr  # the folder as a user finds it, not the spec's way there
    with gw.client() as client:
        assert len(client.runs()) == runs_before  # neither was queued
