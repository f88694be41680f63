"""The pure parts: the per-run rate limit on a fake clock, the GPU conditions, the messages."""

from __future__ import annotations

from gpuwarden.core.notify.gpu_watch import GpuWatch
from gpuwarden.core.notify.limiter import RateLimit
from gpuwarden.core.notify.rules import RunFacts, compose, event_kind, gpu_notice
from gpuwarden.core.telemetry.types import GpuSample


def test_the_limit_holds_back_past_n_per_window_and_folds_them_into_the_next_message() -> None:
    limit = RateLimit(2, 600)
    assert limit.admit("r1", "restarted", 0) == (True, None)
    assert limit.admit("r1", "restarted", 1) == (True, None)
    assert limit.admit("r1", "restarted", 2) == (False, None)
    assert limit.admit("r1", "idle", 3) == (False, None)
    assert limit.admit("r2", "restarted", 3) == (True, None)  # another run has its own window
    assert limit.due(599) == []  # no room yet
    send, held = limit.admit("r1", "restarted", 601)  # the first message left the window
    assert send and held is not None
    assert held.counts == {"restarted": 1, "idle": 1}
    assert held.line() == "and 2 more held back by the rate limit: idle ×1, restarted ×1"


def test_a_runs_end_is_never_held_back_and_carries_what_was() -> None:
    limit = RateLimit(1, 600)
    limit.admit("r1", "restarted", 0)
    for t in range(1, 6):
        assert limit.admit("r1", "restarted", t) == (False, None)
    send, held = limit.admit("r1", "failed", 10)
    assert send and held is not None and held.counts == {"restarted": 5}


def test_what_was_held_back_is_summed_up_once_the_window_has_room() -> None:
    limit = RateLimit(1, 60)
    limit.admit("r1", "idle", 0)
    limit.admit("r1", "restarted", 1)
    limit.admit("r1", "restarted", 2)
    assert limit.due(30) == []
    (held,) = limit.due(61)
    assert held.run_id == "r1" and held.total == 2
    assert limit.due(62) == []  # told once
    assert limit.due(200) == [] and limit.tracked == 0  # a quiet run is forgotten


def _sample(ts: float, util: float, throttle: int = 0, uuid: str = "GPU-a") -> GpuSample:
    return GpuSample(ts=ts, uuid=uuid, util_gpu=util, throttle_reasons=throttle)


def test_a_held_gpu_idle_for_its_bound_is_told_once_per_episode() -> None:
    watch = GpuWatch(idle_s=60, throttle_s=0)
    held = {"GPU-a": ("r1",)}
    assert watch.observe(0, [_sample(0, 0)], held) == []
    assert watch.observe(59, [_sample(59, 2)], held) == []
    (told,) = watch.observe(60, [_sample(60, 0)], held)
    assert told.kind == "idle" and told.runs == ("r1",) and told.minutes == 1
    assert watch.observe(120, [_sample(120, 0)], held) == []  # the same episode
    watch.observe(121, [_sample(121, 90)], held)  # busy again: the episode is over
    assert watch.observe(130, [_sample(130, 0)], held) == []
    assert len(watch.observe(190, [_sample(190, 0)], held)) == 1


def test_an_idle_gpu_no_run_holds_is_nobodys_business() -> None:
    watch = GpuWatch(idle_s=1, throttle_s=0)
    assert watch.observe(0, [_sample(0, 0)], {}) == []
    assert watch.observe(10, [_sample(10, 0)], {}) == []


def test_thermal_throttling_that_lasts_is_told_but_a_power_cap_is_not() -> None:
    watch = GpuWatch(idle_s=0, throttle_s=30)
    power_cap, hw_thermal = 0x4, 0x40
    assert watch.observe(0, [_sample(0, 100, power_cap)], {}) == []
    assert watch.observe(40, [_sample(40, 100, power_cap)], {}) == []
    watch.observe(50, [_sample(50, 100, hw_thermal)], {"GPU-a": ("r1",)})
    (told,) = watch.observe(80, [_sample(80, 100, hw_thermal | power_cap)], {"GPU-a": ("r1",)})
    assert told.kind == "throttled" and told.reasons == ("hw_thermal",)


def test_a_failure_names_host_run_and_last_log_lines() -> None:
    event = {"run_id": "r1", "type": "state", "state": "failed", "source": "daemon", "attempt": 2,
             "message": "attempt 2: exit code 1", "ts": 5.0}  # fmt: skip
    assert event_kind(event) == "failed"
    facts = RunFacts("r1", "bert", log_tail="Traceback\nValueError: bad")
    notice = compose("failed", event, facts, "gpu-box")
    assert notice.title == "bert failed"
    assert notice.body.startswith("Run bert (r1) on gpu-box failed: attempt 2: exit code 1")
    assert notice.body.endswith("Last lines of attempt 2's stderr:\nTraceback\nValueError: bad")
    env = notice.environment()
    assert env["GPUWARDEN_EVENT"] == "failed" and env["GPUWARDEN_HOST"] == "gpu-box"
    assert env["GPUWARDEN_RUN"] == "r1" and env["GPUWARDEN_ATTEMPT"] == "2" and env["GPUWARDEN_GPU"] == ""


def test_which_events_make_a_message() -> None:
    def kind(**event: object) -> str | None:
        return event_kind({"source": "daemon", **event})

    assert kind(type="state", state="succeeded") == "succeeded"
    assert kind(type="state", state="running") is None
    assert kind(type="retuned") == "retuned"
    assert kind(type="restart") == "restarted"
    assert kind(type="hang") == "hung"
    assert kind(type="progress") is None
    assert event_kind({"type": "hang", "source": "runner"}) is None  # a program cannot forge one


def test_a_retune_without_its_record_says_the_changes_and_the_reason() -> None:
    event = {"type": "retuned", "attempt": 1, "changes": {"micro_batch": 8}, "reason": "peak 70 GiB"}
    notice = compose("retuned", event, RunFacts("r1", "bert"), "h")
    assert (
        notice.body
        == "Run bert (r1) on h ran out of memory in attempt 1 and was retuned: micro_batch → 8. peak 70 GiB"
    )


def test_a_gpu_condition_names_the_gpu_and_the_run() -> None:
    watch = GpuWatch(idle_s=60, throttle_s=0)
    watch.observe(0, [_sample(0, 0)], {"GPU-a": ("r1",)})
    (cond,) = watch.observe(600, [_sample(600, 0)], {"GPU-a": ("r1",)})
    notice = gpu_notice(cond, "0 (GPU-a)", RunFacts("r1", "bert"), "h")
    assert notice.title == "bert: GPU 0 (GPU-a) idle"
    assert (
        notice.body == "GPU 0 (GPU-a), held by run bert (r1) on h, has been idle (under 5% busy) for 10 min."
    )
    assert notice.gpu == "0 (GPU-a)" and notice.run_id == "r1"
