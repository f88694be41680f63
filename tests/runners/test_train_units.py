"""In-process unit tests of the runner's building blocks (fast; no subprocess)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import parse_spec
from gpuwarden.core.config.spec_train import SchedulerSpec
from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.events import Progress, decode
from gpuwarden.runners.__main__ import next_attempt
from gpuwarden.runners.checkpoint import (
    CheckpointPayload,
    RngState,
    find_latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from gpuwarden.runners.device import memory_stats, resolve_precision
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.train.causal_lm import PadCollate, load_texts
from gpuwarden.runners.train.loop import lr_lambda
from gpuwarden.runners.train.sampling import PositionSampler, epoch_permutation

CPU = torch.device("cpu")


def payload(step: int) -> CheckpointPayload:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    return CheckpointPayload(
        step=step,
        samples_seen=step * 8,
        model=model.state_dict(),
        optimizer=opt.state_dict(),
        scheduler={"last_epoch": step},
        rng=RngState.capture(),
        meta={"tokens_seen": step * 100},
    )


def test_checkpoints_are_atomic_pruned_and_newest_wins(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(root, payload(step), keep=2, reason="interval")
    assert [p.name for p in list_checkpoints(root)] == ["00000002", "00000003"]
    # a half-written checkpoint (temp name, or no meta.json) is never picked
    (root / ".tmp-9-1").mkdir()
    (root / "00000009").mkdir()
    latest = find_latest_checkpoint(root)
    assert latest is not None and latest.name == "00000003"
    loaded = load_checkpoint(latest)
    assert loaded.step == 3 and loaded.samples_seen == 24 and loaded.meta["tokens_seen"] == 300
    assert loaded.meta["reason"] == "interval" and loaded.scaler is None
    # saving the same step again replaces it
    save_checkpoint(root, payload(3), keep=2, reason="oom")
    assert load_checkpoint(root / "00000003").meta["reason"] == "oom"
    assert not (root / ".tmp-9-1").exists()


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(2)
    saved = payload(1)
    expected = (torch.rand(3), random.random())
    path = save_checkpoint(tmp_path, saved, keep=1, reason="interval")
    torch.rand(5)
    random.random()
    rng = load_checkpoint(path).rng
    assert rng is not None
    rng.restore()
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_position_sampler_resumes_at_the_same_sample() -> None:
    whole = list(PositionSampler(7, seed=3, start=0, stop=30))
    assert sorted(i for e, i in whole[:7]) == list(range(7))
    assert [e for e, _ in whole] == [p // 7 for p in range(30)]
    assert whole[:7] != whole[7:14]  # a new order each epoch
    for start in (1, 7, 11, 29):
        assert list(PositionSampler(7, seed=3, start=start, stop=30)) == whole[start:]
    assert torch.equal(epoch_permutation(7, 3, 2), epoch_permutation(7, 3, 2))


def test_pad_collate_masks_padding_and_counts_label_tokens() -> None:
    batch = PadCollate(pad_id=0, max_length=12)([[5, 6, 7], [8, 9, 10, 11, 12]])
    assert batch.tensors["input_ids"].shape == (2, 8)  # longest 5 → rounded up to 8
    assert batch.tensors["labels"][0].tolist() == [5, 6, 7] + [-100] * 5
    assert batch.units == 2 + 4 and batch.tokens == 8 and batch.size == 2


def test_lr_schedule_warms_up_then_decays_to_min_ratio() -> None:
    f = lr_lambda(SchedulerSpec(schedule="cosine", warmup_steps=2, min_lr_ratio=0.1), total_steps=10)
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == pytest.approx(1.0) and f(10) == pytest.approx(0.1) and f(6) == pytest.approx(0.55)
    linear = lr_lambda(SchedulerSpec(schedule="linear", min_lr_ratio=0.0), total_steps=4)
    assert [linear(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_lambda(SchedulerSpec(schedule="constant"), 4)(3) == 1.0


def test_precision_on_cpu() -> None:
    assert resolve_precision("auto", CPU).used == "fp32"
    assert resolve_precision("fp32", CPU).warning is None
    bf16 = resolve_precision("bf16", CPU)
    assert bf16.used == "bf16" and bf16.autocast and not bf16.needs_grad_scaler and bf16.warning
    with pytest.raises(UserError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", CPU)


def test_cpu_memory_stats_are_resident_set() -> None:
    stats = memory_stats(CPU)
    assert stats.allocated is not None and stats.allocated > 10 << 20
    assert stats.peak is not None and stats.peak >= stats.allocated and stats.num_alloc_retries is None


def test_event_writer_appends_lines_and_survives_a_full_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a" / "events.jsonl"
    with EventWriter(path) as writer:
        writer.emit(Progress(step=1, samples_seen=8))
    with EventWriter(path) as writer:
        writer.emit(Progress(step=2, samples_seen=16))
    lines = path.read_text().splitlines()
    assert [decode(line)["step"] for line in lines] == [1, 2]  # type: ignore[index]
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    full = EventWriter(Path("/dev/full"))
    for step in range(3):
        full.emit(Progress(step=step, samples_seen=0))  # must not raise
    full.close()
    assert capsys.readouterr().err.count("cannot write events") == 1


def test_attempt_numbers_and_one_line_messages(tmp_path: Path) -> None:
    assert next_attempt(tmp_path) == 1
    (tmp_path / "attempts" / "1").mkdir(parents=True)
    (tmp_path / "attempts" / "3").mkdir()
    assert next_attempt(tmp_path) == 4
    assert one_line("a: bad\n  b: worse\n") == "a: bad; b: worse"


def test_resolve_relative_paths_against_the_spec_directory(tmp_path: Path) -> None:
    spec = parse_spec(
        "version: 1\nname: x\nkind: train\n"
        "train: {task: causal_lm, model: models/tiny, data: /abs/texts.jsonl, tokenizer: ~/tok}\n"
    )
    resolved = resolve_relative_paths(spec, tmp_path)
    assert resolved.train is not None and spec.train is not None
    assert resolved.train.model == tmp_path / "models" / "tiny"
    assert resolved.train.data == Path("/abs/texts.jsonl")
    assert resolved.train.tokenizer == Path.home() / "tok"
    assert spec.train.model == Path("models/tiny")  # the input is not modified
    infer = parse_spec(
        "version: 1\nname: y\nkind: infer\ninfer: {task: generate, model: m, input: in.jsonl, output: out}\n"
    )
    got = resolve_relative_paths(infer, tmp_path).infer
    assert got is not None and (got.model, got.input, got.output) == (
        tmp_path / "m",
        tmp_path / "in.jsonl",
        tmp_path / "out",
    )
    command = parse_spec("version: 1\nname: z\nkind: command\ncommand: {argv: [ls], cwd: work}\n")
    cmd = resolve_relative_paths(command, tmp_path).command
    assert cmd is not None and cmd.cwd == tmp_path / "work"


@pytest.mark.parametrize("content", ["[" * 100_000, '{"text": ' * 100_000 + "\n"])
def test_deeply_nested_data_is_bad_data_not_a_crash(tmp_path: Path, content: str) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_texts(path, "text")
    assert info.value.code == "bad_data" and str(path) in str(info.value)
