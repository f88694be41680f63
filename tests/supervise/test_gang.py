"""Multi-process runs ("gangs") in the supervisor, with the fake process layer and the fake clock:
the torchrun launch, one rank's OOM stopping the whole gang at once and the retune applied to
every rank, the hang watchdog, the per-rank view, and re-adoption after a daemon restart."""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.oom.recovery import AttemptFacts, plan_recovery
from gpuwarden.core.oom.roles import effective_batch_of
from gpuwarden.core.run_state import RunState
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.telemetry.topology import GpuLink, GpuTopology, PcieLevel
from gpuwarden.daemon.oom_retune import rank_events
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import RUN_TAG
from gpuwarden.daemon.supervise import AttemptEnd, Hooks, NextAttempt, RetuneNotes
from gpuwarden.daemon.supervise.gang_stop import GANG_GRACE_S
from tests.supervise.conftest import GIB, Rig
from tests.supervise.fakes import FakeProcess

RANK_PIDS = {0: 9100, 1: 9101}
# What a stack dump shows: rank 0 waits in an all-reduce, rank 1 sleeps outside any collective.
STACKS = {
    0: 'File "/venv/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
    'File "/repo/gpuwarden/runners/gang.py", line 180 in sum_counts\n',
    1: 'File "/repo/gpuwarden/runners/train/stall_hook.py", line 29 in stall_forever\n',
}
WATCH = {"factor": 5, "min_seconds": 10, "warmup_steps": 1}


def gang_spec(name: str = "ddp", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "kind": "train",
        "resources": {"gpus": 2, "memory_limit": "8GiB"},
        "train": {"task": "image", "batch_size": 16, "world_size": 2, "max_steps": 100, "log_interval": 1},
        "policy": {"base": "default", "hang": WATCH},
    }
    spec.update(extra)
    return spec


def start_gang(rig: Rig, **extra: Any) -> tuple[str, FakeProcess]:
    run_id = rig.submit(gang_spec(**extra))
    rig.step()
    proc = rig.proc_of(run_id)
    proc.ranks = dict(RANK_PIDS)
    proc.stacks = dict(STACKS)
    for rank, pid in RANK_PIDS.items():
        proc.emit("started", rank=rank, pid=pid, device=f"cuda:{rank}", world_size=2, task="image")
    return run_id, proc


def progress(rig: Rig, proc: FakeProcess, step: int, ranks: Sequence[int] = (0, 1), dt: float = 1.0) -> None:
    """Every rank in `ranks` reports `step`, `dt` seconds after the previous one (runner and daemon
    clocks alike), and the daemon reads it."""
    rig.clock.advance(dt)
    for rank in ranks:
        proc.emit(
            "progress",
            rank=rank,
            step=step,
            samples_seen=step * 32,
            batch_size=16,
            mem_peak=(10 + rank) * GIB,
            mem_reserved=(12 + rank) * GIB,
            ts=rig.clock(),
        )
    rig.step()


def core_retune(run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]]) -> NextAttempt:
    """The retune maths the daemon's hook uses (`core.oom.recovery`), without its waits and probes,
    on the failed rank's events as the hook gives them."""
    spec = spec_from_mapping(dict(run["spec"]))
    facts = AttemptFacts(
        end.number,
        [dict(e) for e in rank_events(events, end)],
        end.stderr_tail,
        end.exit_code,
        end.signal,
        end.oom_kill,
        end.gpu_capacity,
        end.host_capacity,
    )
    plan = plan_recovery(spec, facts, history=[], retunes_so_far=0, elapsed_s=0.0)
    assert plan.spec is not None, plan.give_up
    return NextAttempt(plan.spec, plan.from_, plan.to, plan.classification.verdict, plan.evidence())


class Recording:
    def __init__(self) -> None:
        self.ends: list[AttemptEnd] = []
        self.ranks_seen: list[set[Any]] = []

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes,
    ) -> NextAttempt:
        self.ends.append(end)
        self.ranks_seen.append({e.get("rank") for e in rank_events(events, end) if e["source"] == "runner"})
        return core_retune(run, end, events)


# -- launch ------------------------------------------------------------------------------------------


def test_a_two_rank_run_starts_as_one_torchrun_on_two_gpus_by_uuid(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    argv = proc.argv
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2" and argv[argv.index("--max-restarts") + 1] == "0"
    assert "--standalone" in argv
    assert argv[argv.index("--log-dir") + 1] == str(proc.stdout.parent / "ranks")
    assert argv[-8:-6] == ["-m", "gpuwarden.runners"] and argv[-1] == "1"  # --attempt 1
    assert proc.env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1" and proc.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert proc.env["TORCHELASTIC_ERROR_FILE"] == str(proc.stdout.parent / "torchrun-error.json")
    assert proc.env[RUN_TAG] == f"{run_id}/1" and int(proc.env["OMP_NUM_THREADS"]) >= 1
    assert proc.memory_limit == 8 * GIB  # the exec wrapper's limit, which every rank inherits
    (attempt,) = rig.attempts(run_id)
    assert attempt["world_size"] == 2 and attempt["gpus"] == ["GPU-0", "GPU-1"]
    messages = [e["message"] or "" for e in rig.events(run_id, "state")]
    assert "attempt 1 on GPU-0, GPU-1 (2 ranks through torchrun)" in messages


def test_a_users_script_with_launcher_torchrun_runs_under_torchrun(rig: Rig) -> None:
    spec = {
        "name": "mine",
        "kind": "command",
        "command": {"argv": ["python", "train.py", "--bs", "{bs}"], "launcher": "torchrun"},
        "knobs": {"bs": 4},
        "resources": {"gpus": 2},
    }
    run_id = rig.submit(spec)
    rig.step()
    argv = rig.proc_of(run_id).argv
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]  # the script's own interpreter
    assert argv[-3:] == ["train.py", "--bs", "4"] and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert rig.attempts(run_id)[0]["world_size"] == 2


def test_a_gang_is_placed_on_the_best_linked_gpus(rig: Rig) -> None:
    rig.gpus = [GpuState(f"GPU-{i}", i, 80 * GIB, 1 * GIB) for i in range(4)]
    links = {
        frozenset((f"GPU-{a}", f"GPU-{b}")): GpuLink(pcie=PcieLevel.SYSTEM)
        for a in range(4)
        for b in range(a)
    }
    links[frozenset(("GPU-1", "GPU-3"))] = GpuLink(nvlinks=4)
    rig.topology = GpuTopology(links)
    run_id, proc = start_gang(rig)
    assert proc.env["CUDA_VISIBLE_DEVICES"] == "GPU-1,GPU-3"
    assert rig.attempts(run_id)[0]["gpus"] == ["GPU-1", "GPU-3"]


# -- one rank out of memory ------------------------------------------------------------------------------


def test_one_ranks_oom_stops_the_whole_gang_and_every_rank_is_retuned(rig: Rig) -> None:
    hook = Recording()
    rig.use(Hooks(retune=hook))
    rig.procs.ignores_sigterm = True  # torchrun still waits for a rank stuck in a collective
    run_id, proc = start_gang(rig)
    progress(rig, proc, 1)
    proc.emit(
        "oom",
        rank=1,
        verdict="gpu_capacity",
        message="CUDA out of memory. Tried to allocate 2.00 GiB",
        phase="forward",
        batch_size=16,
        step=1,
        ts=rig.clock(),
    )
    proc.emit(
        "error",
        rank=0,
        code="gang_aborted",
        message="rank 0 stopped: another rank stopped first",
        ts=rig.clock() + 0.5,
    )
    rig.step()
    # at once: SIGTERM to torchrun's group, recorded with the rank's reason
    assert proc.signals == [signal.SIGTERM] and proc.running
    (stopping,) = rig.events(run_id, "gang_stopping")
    assert (stopping["cause"], stopping["rank"], stopping["grace_seconds"]) == ("oom", 1, GANG_GRACE_S)
    rig.clock.advance(GANG_GRACE_S - 0.1)
    rig.step()
    assert proc.running  # still within the grace
    rig.clock.advance(0.2)
    rig.step()
    # after the short grace: SIGKILL to torchrun and every rank's group
    assert proc.signals == [signal.SIGTERM, signal.SIGKILL] and proc.rank_signals == [signal.SIGKILL]
    assert not proc.ranks
    rig.step()  # torchrun ended: the retune hook decides (inline here)
    rig.step()  # the loop applies the decision: the next attempt starts
    first, second = rig.attempts(run_id)
    assert first["classification"] == "oom" and first["reason"].startswith(
        "rank 1: out of memory (gpu_capacity)"
    )
    ((end), (seen)) = (hook.ends[0], hook.ranks_seen[0])
    assert end.rank == 1 and end.world_size == 2 and end.gpus == ["GPU-0", "GPU-1"]
    assert seen == {1}  # the retune saw the failed rank's events only
    run = rig.run(run_id)
    assert run["state"] == RunState.RUNNING and second["world_size"] == 2
    train = run["spec"]["train"]
    assert (train["batch_size"], train["grad_accum_steps"], train["world_size"]) == (8, 2, 2)
    assert effective_batch_of(run["spec"]) == 16 * 1 * 2  # micro × accumulation × world size kept
    assert rig.procs.last.argv[2] == "torch.distributed.run" and rig.procs.last.env["CUDA_VISIBLE_DEVICES"]
    (retune,) = rig.retunes(run_id)
    assert retune["to"] == {"train.batch_size": 8, "train.grad_accum_steps": 2}


def test_a_rank_failing_on_its_own_stops_the_gang_and_fails_the_run_with_its_reason(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    progress(rig, proc, 1)
    proc.emit("error", rank=1, code="bad_data", message="texts.jsonl line 7 is not JSON — fix the line")
    rig.step()
    assert proc.signals == [signal.SIGTERM] and not proc.running
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED
    assert "rank 1: texts.jsonl line 7 is not JSON" in run["message"]


def test_a_stopped_gang_is_killed_whole_after_the_grace(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id, proc = start_gang(rig)
    rig.sup.stop_run(run_id, grace=5)
    rig.clock.advance(5.1)
    rig.step()
    assert proc.rank_signals == [signal.SIGKILL] and not proc.running
    rig.step()
    assert rig.state(run_id) == RunState.STOPPED


# -- the hang watchdog -----------------------------------------------------------------------------------


def test_a_gang_without_progress_past_its_bound_is_dumped_stopped_and_recorded_as_hung(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    for step in range(1, 5):  # 1 s a step; step 1 is the warm-up
        progress(rig, proc, step)
    # bound = max(10 s floor, 5 × 1 s median step × 1 step between progress events) = 10 s
    rig.clock.advance(9.9)
    rig.step()
    assert not rig.events(run_id, "hang") and proc.signals == []
    rig.clock.advance(0.2)
    rig.step()
    (hang,) = rig.events(run_id, "hang")
    assert rig.procs.dumped == [[0, 1]]
    assert hang["suspects"] == [1] and hang["bound_s"] == 10.0 and hang["median_step_s"] == 1.0
    assert hang["last_steps"] == {"0": 4, "1": 4} and 10.0 < hang["quiet_s"] < 10.2
    assert "stall_forever" in hang["stacks"]["1"]["text"] and hang["stacks"]["0"]["how"] == "SIGUSR1"
    dump = proc.stdout.parent / "hang-dump.txt"
    assert hang["dump"] == str(dump) and "=== rank 1 (pid 9101, SIGUSR1) ===" in dump.read_text()
    assert proc.signals == [signal.SIGTERM]
    rig.step()
    (attempt,) = rig.attempts(run_id)
    assert attempt["classification"] == "hang"
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED and "hang: no progress for 10 s" in run["message"]
    assert "rank 1 outside any collective" in run["message"]
    # the per-rank view marks the rank the others waited for
    ranks = attempt["ranks"]
    assert [r["straggler"] for r in ranks] == [False, True]


def test_a_hung_gang_restarts_under_its_restart_policy(rig: Rig) -> None:
    run_id, proc = start_gang(rig, restart={"on": ["hang"], "max": 1, "backoff": 0})
    for step in range(1, 4):
        progress(rig, proc, step)
    rig.clock.advance(30)
    rig.step()  # hung: SIGTERM (this torchrun exits on it)
    rig.step()  # ended: restart 1 of 1, queued
    (restart,) = rig.events(run_id, "restart")
    assert restart["cause"] == "hang"
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and len(rig.attempts(run_id)) == 2
    assert rig.attempts(run_id)[0]["restart"]["cause"] == "hang"


def test_the_watchdog_waits_out_the_warm_up_and_scales_with_the_steps_between_reports(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    progress(rig, proc, 1, dt=30.0)  # a slow first step (loading): not timed
    rig.clock.advance(60)
    rig.step()
    assert not rig.events(run_id, "hang")  # not armed: no step after the warm-up timed yet
    progress(rig, proc, 2, dt=1.0)  # the warm-up step: not timed either
    progress(rig, proc, 4, dt=6.0)  # a progress event every 2 steps of 3 s
    progress(rig, proc, 6, dt=6.0)
    # bound = max(10 s floor, 5 × 3 s median step × 2 steps between progress events) = 30 s
    rig.clock.advance(29.9)
    rig.step()
    assert not rig.events(run_id, "hang")
    rig.clock.advance(0.2)
    rig.step()
    (hang,) = rig.events(run_id, "hang")
    assert (hang["bound_s"], hang["median_step_s"], hang["stride"]) == (30.0, 3.0, 2)


def test_a_stopping_gang_is_never_declared_hung(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id, proc = start_gang(rig)
    for step in range(1, 4):
        progress(rig, proc, step)
    rig.sup.stop_run(run_id, grace=600)
    rig.clock.advance(100)
    rig.step()
    assert not rig.events(run_id, "hang")


# -- the per-rank view -----------------------------------------------------------------------------------


def test_each_rank_is_shown_with_its_gpu_memory_and_step_and_the_one_behind_is_marked(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    progress(rig, proc, 1)
    progress(rig, proc, 2, ranks=[0])
    (attempt,) = rig.attempts(run_id)
    r0, r1 = attempt["ranks"]
    assert (r0["rank"], r0["pid"], r0["gpu"], r0["device"], r0["step"]) == (0, 9100, "GPU-0", "cuda:0", 2)
    assert (r1["rank"], r1["pid"], r1["gpu"], r1["step"], r1["mem_peak"]) == (1, 9101, "GPU-1", 1, 11 * GIB)
    assert (r0["straggler"], r1["straggler"]) == (False, True)
    assert r1["straggler_reason"] == "at step 1, others at up to 2"
    progress(rig, proc, 2, ranks=[1])
    assert not any(r["straggler"] for r in rig.attempts(run_id)[0]["ranks"])
    # the run's metrics are the gang's (rank 0's), one row per step
    metrics = rig.writer.call(lambda db: RunStore(db).metrics(run_id))
    assert [m["step"] for m in metrics] == [1, 2]


# -- a daemon restart ------------------------------------------------------------------------------------


def test_a_daemon_restart_readopts_the_whole_gang_and_reads_every_rank_on(rig: Rig) -> None:
    hook = Recording()
    rig.use(Hooks(retune=hook))
    run_id, proc = start_gang(rig)
    progress(rig, proc, 1)
    # written while no daemon watches
    proc.emit("progress", rank=0, step=2, samples_seen=64, ts=rig.clock())
    proc.emit("progress", rank=1, step=2, samples_seen=64, ts=rig.clock())
    rig.restart()
    active = rig.sup.active[run_id]
    assert active.child.adopted and active.world_size == 2 and sorted(active.rank_tails) == [1]
    assert active.rank_pids == RANK_PIDS  # from the ranks' stored `started` events
    for rank in (0, 1):  # every event of every rank stored exactly once
        steps = [e["step"] for e in rig.events(run_id, "progress") if e["rank"] == rank]
        assert steps == [1, 2]
    # the new daemon stops the whole gang on a rank's OOM, as the old one would have
    proc.emit("oom", rank=1, verdict="gpu_capacity", message="CUDA out of memory", batch_size=16, step=2)
    rig.step()
    assert signal.SIGTERM in proc.signals
    rig.step(2)
    assert hook.ends and hook.ends[0].rank == 1 and hook.ends[0].adopted
    assert rig.attempts(run_id)[0]["classification"] == "oom" and rig.state(run_id) == RunState.RUNNING


def test_a_gang_that_hung_while_no_daemon_watched_is_caught_one_bound_after_its_adoption(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    for step in range(1, 5):
        progress(rig, proc, step)
    rig.restart()
    rig.clock.advance(9.9)  # the bound (10 s) counts from the adoption
    rig.step()
    assert not rig.events(run_id, "hang")
    rig.clock.advance(0.2)
    rig.step()
    (hang,) = rig.events(run_id, "hang")
    assert hang["median_step_s"] == 1.0 and hang["suspects"] == [1]


def test_a_gang_spawned_but_not_recorded_is_found_by_torchruns_tag(rig: Rig) -> None:
    run_id, proc = start_gang(rig)
    # the ranks lead sessions of their own and carry the attempt's tag too; torchrun came first
    for rank, pid in RANK_PIDS.items():
        rig.clock.advance(0.5)
        child = rig.procs.spawn(
            ["rank"],
            {RUN_TAG: f"{run_id}/1"},
            None,
            proc.stdout.parent / f"r{rank}.out",
            proc.stdout.parent / f"r{rank}.err",
        )
        rig.procs.spawned.pop()
        assert child.pid != pid
    rig.writer.call(lambda db: db.conn.execute("UPDATE attempts SET pid = NULL, create_time = NULL"))
    rig.restart()
    assert rig.sup.active[run_id].child.pid == proc.pid
