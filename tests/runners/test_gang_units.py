"""The pieces of a gang rank that need no second process: sample sharding, the rank environment,
per-rank events and RNG files, error files, the stall and pause hooks' switches."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM, Oom, Progress
from gpuwarden.runners.checkpoint import CheckpointPayload, RngState, load_checkpoint, save_checkpoint
from gpuwarden.runners.error_file import ERROR_FILE_ENV, write_error_file
from gpuwarden.runners.events import EventWriter
from gpuwarden.runners.gang import Gang, is_peer_failure
from gpuwarden.runners.pause_hook import PAUSE_ENV, pause_step, wait_for_stop
from gpuwarden.runners.rank_env import RankEnv, check_world_size, rank_env
from gpuwarden.runners.stop import StopRequest
from gpuwarden.runners.train.sampling import PositionSampler, rank_positions
from gpuwarden.runners.train.stall_hook import STALL_ENV, stall_step


@pytest.mark.parametrize(("world", "micro", "accum"), [(1, 8, 1), (2, 4, 1), (2, 2, 2), (4, 1, 2), (3, 2, 1)])
def test_the_ranks_together_cover_each_step_exactly_as_one_process(
    world: int, micro: int, accum: int
) -> None:
    per_rank = micro * accum
    effective = per_rank * world
    start, steps = 5 * effective, 4
    stop = start + steps * effective
    shares = [list(rank_positions(start, stop, r, world, per_rank)) for r in range(world)]
    for step in range(steps):
        lo = start + step * effective
        step_positions = sorted(p for share in shares for p in share[step * per_rank : (step + 1) * per_rank])
        assert step_positions == list(range(lo, lo + effective))
    for rank in range(world):
        sampler = PositionSampler(10, 0, start, stop, rank=rank, world_size=world, per_rank=per_rank)
        assert len(sampler) == len(list(sampler)) == steps * per_rank


def test_one_process_keeps_the_whole_stream() -> None:
    sampler = PositionSampler(7, 3, 4, 19)
    assert len(sampler) == len(list(sampler)) == 15
    assert list(sampler) == list(PositionSampler(7, 3, 4, 19, world_size=1, per_rank=5))


def test_rank_environment_comes_from_torchrun() -> None:
    assert rank_env({}) is None
    assert rank_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == RankEnv(1, 1, 2)
    with pytest.raises(UserError, match="not numbers"):
        rank_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_world_size_must_match_what_torchrun_started() -> None:
    check_world_size(1, None)
    check_world_size(2, RankEnv(0, 0, 2))
    with pytest.raises(UserError, match="needs 2 processes started by torchrun"):
        check_world_size(2, None)
    with pytest.raises(UserError, match="torchrun started 3 processes"):
        check_world_size(2, RankEnv(0, 0, 3))


def test_a_gang_of_one_is_the_identity() -> None:
    gang = Gang()
    model = torch.nn.Linear(2, 2)
    assert not gang.distributed and gang.is_main and gang.wrap(model) is model
    assert gang.sum_counts([3, 1]) == [3, 1] and gang.gather("x") == ["x"]


def test_collective_failures_are_told_from_other_errors() -> None:
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    )
    assert is_peer_failure(gloo)
    assert is_peer_failure(torch.distributed.DistBackendError("NCCL watchdog timeout"))
    assert not is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_failure(ValueError("Connection reset by peer"))


def test_each_ranks_events_carry_its_rank_and_its_last_failure(tmp_path: Path) -> None:
    path = tmp_path / "events.rank1.jsonl"
    with EventWriter(path, rank=1) as events:
        events.emit(Progress(step=1, samples_seen=8))
        events.emit(Oom(verdict="host_oom", message="no memory"))
        assert events.last_failure is not None and events.last_failure.type == "oom"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["rank"] for line in lines] == [1, 1]
    with EventWriter(tmp_path / "solo.jsonl") as solo:
        solo.emit(Progress(step=1, samples_seen=8))
    assert "rank" not in json.loads((tmp_path / "solo.jsonl").read_text())


def test_a_ranks_failure_lands_in_torchruns_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(target))
    write_error_file(Oom(verdict="host_oom", message="can't allocate", rank=1), EXIT_OOM, 1)
    record = json.loads(target.read_text())
    assert record["exitcode"] == EXIT_OOM and record["rank"] == 1 and record["event"]["verdict"] == "host_oom"
    assert record["message"]["message"] == "rank 1: oom (host_oom): can't allocate"
    assert int(record["message"]["extraInfo"]["timestamp"]) > 0
    monkeypatch.delenv(ERROR_FILE_ENV)
    target.unlink()
    write_error_file(None, 1, 0)
    assert not target.exists()


def test_every_ranks_rng_travels_in_the_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(1)
    states = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        states.append(RngState.capture())
    payload = CheckpointPayload(
        step=1, samples_seen=8, model={}, optimizer={}, scheduler={}, rng=states[0], rank_rngs=states[1:]
    )
    path = save_checkpoint(tmp_path, payload, keep=1, reason="interval")
    assert sorted(p.name for p in path.glob("rng*.pt")) == ["rng.pt", "rng.rank1.pt", "rng.rank2.pt"]
    for rank, state in enumerate(states):
        loaded = load_checkpoint(path, rank=rank).rng
        assert loaded is not None and torch.equal(loaded.torch_cpu, state.torch_cpu)
    assert load_checkpoint(path, rank=3).rng is None  # written by fewer ranks


def test_the_stall_hook_is_off_unless_named_for_this_rank() -> None:
    assert stall_step(1, {}) is None
    assert stall_step(1, {STALL_ENV: "1:4"}) == 4
    assert stall_step(0, {STALL_ENV: "1:4"}) is None
    assert stall_step(1, {STALL_ENV: "one:4"}) is None


def test_the_pause_hook_is_off_unless_named_for_this_rank_and_waits_for_the_stop_flag() -> None:
    assert pause_step(0, {}) is None
    assert pause_step(0, {PAUSE_ENV: "0:3"}) == 3
    assert pause_step(1, {PAUSE_ENV: "0:3"}) is None
    assert pause_step(0, {PAUSE_ENV: "0:"}) is None
    stop = StopRequest()
    stop.requested = True
    wait_for_stop(stop)  # returns at once once the stop is requested
