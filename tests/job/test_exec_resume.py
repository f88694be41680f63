"""What a run says about resuming is what happened: `gpuwarden exec` runs real scripts that write
checkpoints and fail once (exit 75, which the run's restart policy restarts), and `show --runs`
reads back what each attempt was said to resume from."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.client.run_folders import RunFolders
from gpuwarden.job import exit_codes
from tests.daemon.conftest import DaemonHandle
from tests.job.test_exec import Job

RESTART = "{on: [exit_code: [75]], max: 1, backoff: 0}"

# Writes the checkpoint of step 4, fails on its first attempt, and never loads a checkpoint: every
# attempt trains from step 0, whatever it was handed.
FORGETFUL = """
    import os, sys
    from pathlib import Path

    folder = Path("ckpt")
    folder.mkdir(exist_ok=True)
    print("training from step 0", flush=True)
    (folder / "step=4.ckpt").write_text("weights at step 4")
    if os.environ["GPUWARDEN_ATTEMPT"] == "1":
        sys.exit(75)
"""

# Lightning's flags, but no --ckpt_path: what `--framework lightning` may not count on.
NO_CKPT_FLAG = """
    import argparse, os, sys
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.parse_args()
    folder = Path("lightning_logs/version_0/checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step=4.ckpt").write_text("weights at step 4")
    if os.environ["GPUWARDEN_ATTEMPT"] == "1":
        sys.exit(75)
"""

# Takes its checkpoint from the SDK rather than from its command line.
THROUGH_THE_SDK = """
    import os, sys
    from pathlib import Path
    from gpuwarden import sdk

    start = sdk.resume_from()
    print(f"training from {start or 'step 0'}", flush=True)
    folder = Path("ckpt")
    folder.mkdir(exist_ok=True)
    (folder / "step=4.ckpt").write_text("weights at step 4")
    if os.environ["GPUWARDEN_ATTEMPT"] == "1":
        sys.exit(75)
"""

# A plain DataLoader of 8 batches, a checkpoint every 2 steps, and a failure in step 3 of the
# first attempt: the next attempt resumes from step 2, in the middle of the epoch.
MID_EPOCH = """
    import argparse, os
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            if os.environ["GPUWARDEN_ATTEMPT"] == "1" and self.global_step == 3:
                os._exit(75)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt_path", default=None)
    args = parser.parse_args()
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath="ckpt", filename="{step}", every_n_train_steps=2, save_top_k=-1)],
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=2), ckpt_path=args.ckpt_path)
"""


@pytest.fixture
def job(daemon_factory: Any) -> Iterator[Job]:
    handle: DaemonHandle = daemon_factory(start=False)
    started = Job(handle.root, handle.env)
    yield started
    started.stop_all()


def _script(job: Job, body: str) -> None:
    (job.root / "train.py").write_text(textwrap.dedent(body))


def _exec(job: Job, name: str, command: str, timeout: float = 300) -> tuple[dict[str, Any], str]:
    """Run the spec through `gpuwarden exec` to its end; what `show --runs --json` prints, and
    what the exec printed on stderr."""
    spec = job.spec(
        name, f"name: {name}\nkind: command\nresources: {{gpus: 0}}\nrestart: {RESTART}\n{command}"
    )
    folder = job.root / "runs" / name
    done = job.run(str(spec), "--run", str(folder), timeout=timeout)
    detail = job.show(RunFolders.one(folder).runs()[0].id)
    assert done.returncode == exit_codes.SUCCEEDED, done.stderr[-3000:]
    return detail, done.stderr


def _events(detail: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    page = RunFolders.one(Path(detail["run_dir"])).events(detail["id"], limit=10_000)
    return [e.model_dump() for e in page.events if e.type == kind]


@pytest.mark.slow
def test_a_checkpoint_the_command_passes_nowhere_is_not_said_to_be_resumed_from(job: Job) -> None:
    _script(job, FORGETFUL)
    command = 'command: {argv: ["{python}", train.py], checkpoints: {glob: "ckpt/step=*.ckpt"}}'
    detail, printed = _exec(job, "forgetful", command)
    assert [a["classification"] for a in detail["attempts"]] == ["failed", "succeeded"]
    second = detail["attempts"][1]
    assert second["prepared"]["resume_from"] is None and second["resumed_from"] is None
    found = str(job.root / "ckpt" / "step=4.ckpt")
    assert second["prepared"]["resume_note"] == (
        f"attempt 2 found {found} (step 4) but the command passes it nowhere — it starts from the "
        "beginning; put {resume_from} in its argv, e.g. --resume {resume_from?}"
    )
    (prepared,) = [e for e in _events(detail, "prepared") if e["attempt"] == 2]
    assert prepared["resume_from"] is None
    shown = job.cli("show", "--runs", str(job.runs), detail["id"]).stdout
    assert "passes it nowhere — it starts from the beginning" in shown and "resumes from" not in shown
    # Said once, at submit, before anything ran.
    (warning,) = [e for e in _events(detail, "warning") if e["code"] == "resume_nowhere"]
    assert warning["attempt"] is None and warning["message"] in printed
    assert (
        "passes {resume_from} nowhere" in warning["message"]
        and "--resume {resume_from?}" in warning["message"]
    )


@pytest.mark.slow
def test_a_preset_adds_no_resume_flag_the_script_does_not_take(job: Job) -> None:
    _script(job, NO_CKPT_FLAG)
    command = 'command: {argv: ["{python}", train.py, --batch_size, "4"], framework: lightning}'
    detail, printed = _exec(job, "no-ckpt-flag", command)
    # Attempt 2 is not handed `--ckpt_path …`, which the script would refuse as unrecognized.
    assert [a["classification"] for a in detail["attempts"]] == ["failed", "succeeded"]
    assert all("--ckpt_path" not in a["prepared"]["argv"] for a in detail["attempts"])
    assert detail["spec"]["command"]["resume_flag"] is False
    (warning,) = [e for e in _events(detail, "warning") if e["attempt"] is None]
    assert warning["code"] == "resume_flag_missing" and warning["message"] in printed
    assert "--help` does not list --ckpt_path" in warning["message"]
    assert "sdk.resume_from()" in warning["message"]
    assert "passes it nowhere" in detail["attempts"][1]["prepared"]["resume_note"]


@pytest.mark.slow
def test_a_checkpoint_the_program_takes_through_the_sdk_is_said_to_be_resumed_from(job: Job) -> None:
    _script(job, THROUGH_THE_SDK)
    command = 'command: {argv: ["{python}", train.py], checkpoints: {glob: "ckpt/step=*.ckpt"}}'
    detail, _ = _exec(job, "through-the-sdk", command)
    found = str(job.root / "ckpt" / "step=4.ckpt")
    second = detail["attempts"][1]
    assert second["resumed_from"] == found  # the program said so: a `started` event
    with RunFolders.one(Path(detail["run_dir"])) as reader:
        assert f"training from {found}" in reader.logs(detail["id"], "stdout", 2, 0, 10_000).data
    shown = job.cli("show", "--runs", str(job.runs), detail["id"]).stdout
    assert f"resumed from {found} (the program reported loading it)" in shown
    assert "it starts from the beginning" not in shown


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lightning_resume_in_the_middle_of_an_epoch_is_said_to_differ(job: Job) -> None:
    _script(job, MID_EPOCH)
    argv = '["{python}", train.py, --ckpt_path, "{resume_from?}"]'
    command = f'command: {{argv: {argv}, checkpoints: {{glob: "ckpt/*.ckpt"}}}}'
    detail, _ = _exec(job, "mid-epoch", command, timeout=500)
    (warning,) = [e for e in _events(detail, "warning") if e["code"] == "inexact_resume"]
    assert warning["attempt"] == 2
    second = detail["attempts"][1]
    assert second["resumed_from"] == str(job.root / "ckpt" / "step=2.ckpt")
    line = "resumed mid-epoch: the data order restarts — not the same as an uninterrupted run"
    assert second["resume_warning"].startswith(line)
    shown = job.cli("show", "--runs", str(job.runs), detail["id"]).stdout
    assert line in shown
