"""A user's own training script that runs out of memory: gpuwarden against the frameworks' own
batch-size finders, all on the same script, model, data and memory limit.

The script is the Hugging Face Trainer example (`examples/hf_trainer/finetune.py`) on the tiny
local LM and the ramp texts: the first three optimizer steps see short texts, the fourth long
ones, and micro-batch 16 no longer fits under a 1.8 GiB address-space limit (torch's CPU
allocator fails for real). Arms, each repeated (interleaved) `REPEATS` times:

- gpuwarden: a real daemon runs `gpuwarden run --framework transformers -- python finetune.py …`
  (the Trainer callback on) and recovers it;
- HF `auto_find_batch_size=True`: the same command with that flag, under the same limit;
- Lightning `Tuner.scale_batch_size` (power mode, defaults): the same model and texts in a thin
  LightningModule (`bench/own_scripts/lightning_lm.py`) under the same limit.

Columns: attempts to a running fit (every start of training counts: process attempts, in-process
retries, finder trials), wall time, effective batch at the end, distance of the final weights to
the same script's uninterrupted run at micro-batch 16 × 1 without a limit (‖w − w_ref‖ / ‖w_ref‖),
and the peak RSS of the process that finished. Target: gpuwarden keeps the effective batch,
matches the uninterrupted run, and needs no more attempts than the best finder.

Each repetition also runs the script uninterrupted (16 × 1, no limit), timing its wall and its
start-up (launch to the Trainer loop's first start). gpuwarden's recovery overhead is its wall time
minus the uninterrupted run's, against a target of one start-up plus 10 %: an out-of-process
recovery pays one restart and nothing more. What one restart costs is measured too, by hand: the
same script under the same limit until it runs out, then at once started again from its last
checkpoint at 8 × 2 — the two processes gpuwarden runs, with no supervisor between them.

And gpuwarden's recovery again with its restart forced warm (`--warm-restart`: a standby
interpreter imported the script's libraries while attempt 1 ran) and forced cold
(`--cold-restart`), each with the script's OMP_NUM_THREADS at 2 (training keeps both cores
busy) and at 1 (a core left free, as on a GPU machine, where the training runs on the GPU).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.command.help_check import HELP_TIMEOUT_S, run_help

REPO = Path(__file__).resolve().parents[1]
HF_SCRIPT = REPO / "examples" / "hf_trainer" / "finetune.py"
LIGHTNING_SCRIPT = REPO / "bench" / "own_scripts" / "lightning_lm.py"
RECORDER = REPO / "bench" / "own_scripts" / "record_trainer.py"
LIMIT = "1.8GiB"
LIMIT_BYTES = int(1.8 * 2**30)
MICRO = 16
REPEATS = int(os.environ.get("BENCH_OWN_SCRIPTS_REPEATS", "3"))
PINNED = {"OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
# Identical distance below this: float noise between two runs of the same maths.
SAME_WEIGHTS = 1e-5


@dataclass
class Outcome:
    """One arm's repetition."""

    attempts: int
    ran: bool
    wall_s: float
    effective_batch: int | None
    distance: float | None
    peak_rss: int | None
    note: str = ""
    probes: int = 0
    # gpuwarden only: the CLI's start to attempt 1's start (the submit: the preset's `--help` check
    # among it), and the OOM event to the next attempt's first completed step (the recovery).
    submit_s: float | None = None
    recovery_s: float | None = None


@dataclass
class Uninterrupted:
    """The script run once through without a limit: its wall time and its start-up."""

    wall_s: float
    startup_s: float


@dataclass
class ByHand:
    """The recovery a user does by hand at best: the failed run, then at once its restart."""

    wall_s: float
    distance: float | None


@dataclass
class Arm:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)


def _env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))}
    return {**clean, **PINNED, "PYTHONPATH": str(REPO)}


def _hf_args(assets: Path, out: Path) -> list[str]:
    return [
        "--model", str(assets / "train-lm"),
        "--data", str(assets / "ramp-texts.jsonl"),
        "--output_dir", str(out),
        "--per_device_train_batch_size", str(MICRO),
        "--max_steps", "4",
        "--save_steps", "2",
        "--logging_steps", "1",
        "--train_sampling_strategy", "sequential",
        "--learning_rate", "1e-3",
        "--use_cpu", "true",
        "--report_to", "none",
        "--disable_tqdm", "true",
    ]  # fmt: skip


def _measured(argv: list[str], limit: int | None, log: Path) -> tuple[int, float, int]:
    """Run a process to its end: (exit status, seconds, its peak RSS in bytes from wait4)."""
    if limit is not None:
        argv = [sys.executable, "-m", "gpuwarden.core.rlimit", str(limit), "--", *argv]
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=_env(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - start, int(usage.ru_maxrss) * 1024


def _tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(path)))


def _distance(path: Path, reference: dict[str, Any]) -> float | None:
    if not path.exists():
        return None
    got = _tensors(path)
    diff = sum(float((got[k].double() - v.double()).pow(2).sum()) for k, v in reference.items())
    norm = sum(float(v.double().pow(2).sum()) for v in reference.values())
    return math.sqrt(diff / norm)


def _starts(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Daemon:
    """A gpuwarden daemon in private XDG folders, on the CPU only."""

    def __init__(self, root: Path) -> None:
        (root / "r").mkdir(parents=True, exist_ok=True)
        self.env = {
            **_env(),
            "XDG_CONFIG_HOME": str(root / "c"),
            "XDG_STATE_HOME": str(root / "s"),
            "XDG_RUNTIME_DIR": str(root / "r"),
            "GPUWARDEN_FAKE_NVML": "none",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "daemon"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while self.cli("status").returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not come up")
            time.sleep(0.2)

    def cli(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        if done.returncode != 0:
            raise RuntimeError(f"gpuwarden {' '.join(args)}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _gpuwarden(
    daemon: Daemon,
    assets: Path,
    work: Path,
    n: int,
    reference: dict[str, Any],
    *,
    restart: str | None = None,
    threads: int = 2,
) -> Outcome:
    """gpuwarden's recovery; `restart`: "warm" or "cold" forced (None: the default), `threads`
    the script's OMP_NUM_THREADS (1 leaves a core free, as a GPU machine's training does)."""
    label = f"{restart}-{threads}-" if restart else ""
    out = work / f"gpuwarden-{label}{n}"
    name = f"bench-own-script-{label}{n}"
    start = time.perf_counter()
    start_wall = time.time()
    done = daemon.cli(
        "run", "--framework", "transformers", "--gpus", "0", "--memory-limit", LIMIT,
        "--env", f"OMP_NUM_THREADS={threads}", "--env", "MALLOC_ARENA_MAX=2", "--name", name, "--follow",
        *([f"--{restart}-restart"] if restart else []),
        "--", sys.executable, str(HF_SCRIPT), *_hf_args(assets, out), "--gpuwarden_callback", "true",
    )  # fmt: skip
    wall = time.perf_counter() - start
    detail = daemon.json("show", name)
    ran = done.returncode == 0 and detail["state"] == "succeeded"
    last = len(detail["attempts"])
    events = daemon.json("events", detail["id"])["events"]
    peaks = [
        int(e["mem_peak"])
        for e in events
        if e["type"] == "progress" and e.get("attempt") == last and isinstance(e.get("mem_peak"), int)
    ]
    probes = sum(len((r.get("evidence") or {}).get("probes") or []) for r in detail["retunes"])
    submit_s, recovery_s = _phases(events, start_wall)
    return Outcome(
        attempts=last,
        ran=ran,
        wall_s=wall,
        effective_batch=detail.get("effective_batch"),
        distance=_distance(out / "model.safetensors", reference) if ran else None,
        peak_rss=max(peaks) if peaks else None,
        note="" if ran else f"{detail['state']}: {detail.get('message')}",
        probes=probes,
        submit_s=submit_s,
        recovery_s=recovery_s,
    )


def _phases(events: list[dict[str, Any]], launched: float) -> tuple[float | None, float | None]:
    """(CLI start → attempt 1 started, OOM → the next attempt's first completed step), from the
    run's events."""
    started = next((e["ts"] for e in events if e["type"] == "state" and e.get("attempt") == 1), None)
    oom = next((e for e in events if e["type"] == "oom"), None)
    after = (
        next(
            (e["ts"] for e in events if e["type"] == "progress" and e.get("attempt") == oom["attempt"] + 1),
            None,
        )
        if oom is not None
        else None
    )
    submit = float(started) - launched if started is not None else None
    recovery = float(after) - float(oom["ts"]) if oom is not None and after is not None else None
    return submit, recovery


def _uninterrupted(assets: Path, work: Path, n: int) -> Uninterrupted:
    out = work / f"uninterrupted-{n}"
    out.mkdir(parents=True)
    starts = out / "starts.jsonl"
    argv = [sys.executable, str(RECORDER), str(starts), str(HF_SCRIPT), *_hf_args(assets, out)]
    launched = time.time()
    code, wall, _ = _measured(argv, None, out / "log.txt")
    seen = _starts(starts)
    if code != 0 or not seen:
        raise RuntimeError(f"the uninterrupted run failed (exit {code}): see {out / 'log.txt'}")
    return Uninterrupted(wall, float(seen[0]["ts"]) - launched)


def _beside_help(assets: Path, work: Path, n: int) -> float:
    """The uninterrupted run's wall with the script's `--help` started beside it, as gpuwarden
    reads the help beside a first attempt (its own reader, on a thread, at its priority): what
    sharing the machine with that read costs."""
    argv = [sys.executable, str(HF_SCRIPT), "--help"]
    helper = threading.Thread(target=run_help, args=(argv, _env(), REPO, HELP_TIMEOUT_S))
    helper.start()
    try:
        return _uninterrupted(assets, work, n + 1000).wall_s
    finally:
        helper.join()


def _by_hand(assets: Path, work: Path, n: int, reference: dict[str, Any]) -> ByHand:
    """Run the script under the limit until it runs out, then start it again at once from its
    last checkpoint at half the micro-batch and twice the accumulation (the size gpuwarden picks)."""
    out = work / f"by-hand-{n}"
    argv = [sys.executable, str(HF_SCRIPT), *_hf_args(assets, out)]
    log = work / f"by-hand-{n}-1.log"
    code, first, _ = _measured(argv, LIMIT_BYTES, log)
    if code == 0:
        raise RuntimeError(f"the script did not run out of memory under {LIMIT}: see {log}")
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    again = [
        *argv,
        "--per_device_train_batch_size", str(MICRO // 2),
        "--gradient_accumulation_steps", "2",
        "--resume_from_checkpoint", str(last),
    ]  # fmt: skip
    code, second, _ = _measured(again, LIMIT_BYTES, work / f"by-hand-{n}-2.log")
    if code != 0:
        raise RuntimeError(f"the restart by hand failed (exit {code}): see {work / f'by-hand-{n}-2.log'}")
    return ByHand(first + second, _distance(out / "model.safetensors", reference))


def _auto_find(assets: Path, work: Path, n: int, reference: dict[str, Any]) -> Outcome:
    out = work / f"auto-find-{n}"
    out.mkdir(parents=True)
    starts = out / "starts.jsonl"
    argv = [sys.executable, str(RECORDER), str(starts), str(HF_SCRIPT), *_hf_args(assets, out)]
    code, wall, peak = _measured([*argv, "--auto_find_batch_size", "true"], LIMIT_BYTES, out / "log.txt")
    seen = _starts(starts)
    final = seen[-1] if seen else {}
    ran = code == 0
    return Outcome(
        attempts=len(seen),
        ran=ran,
        wall_s=wall,
        effective_batch=int(final["batch_size"]) * int(final["accum"]) if ran and final else None,
        distance=_distance(out / "model.safetensors", reference) if ran else None,
        peak_rss=peak,
        note="" if ran else f"exit {code}",
    )


def _lightning_argv(assets: Path, out: Path) -> list[str]:
    return [
        sys.executable, str(LIGHTNING_SCRIPT), "--model", str(assets / "train-lm"),
        "--data", str(assets / "ramp-texts.jsonl"), "--out", str(out), "--batch_size", str(MICRO),
    ]  # fmt: skip


def _lightning(assets: Path, work: Path, n: int, reference: dict[str, Any]) -> Outcome:
    out = work / f"lightning-{n}"
    argv = [*_lightning_argv(assets, out), "--find-batch-size"]
    code, wall, peak = _measured(argv, LIMIT_BYTES, work / f"lightning-{n}.log")
    seen = _starts(out / "starts.jsonl")
    final = seen[-1] if seen else {}
    ran = code == 0
    note = ""
    if not ran:
        text = (work / f"lightning-{n}.log").read_text(errors="replace")
        oom = "DefaultCPUAllocator" in text.splitlines()[-1] if text.strip() else False
        what = "ran out of memory" if oom else f"exit {code}"
        note = f"the fit at batch {final.get('batch_size')} {what}"
    return Outcome(
        attempts=len(seen),
        ran=ran,
        wall_s=wall,
        effective_batch=int(final["batch_size"]) * int(final["accum"]) if ran and final else None,
        distance=_distance(out / "final.safetensors", reference) if ran else None,
        peak_rss=peak if ran else None,
        note=note,
    )


def _references(assets: Path, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each script uninterrupted at micro-batch 16 × 1 with no memory limit."""
    hf_out, lt_out = work / "reference-hf", work / "reference-lightning"
    hf_argv = [sys.executable, str(HF_SCRIPT), *_hf_args(assets, hf_out)]
    code, _, _ = _measured(hf_argv, None, work / "ref-hf.log")
    if code != 0:
        raise RuntimeError(f"the HF reference run failed (exit {code}): see {work / 'ref-hf.log'}")
    code, _, _ = _measured(_lightning_argv(assets, lt_out), None, work / "ref-lightning.log")
    if code != 0:
        raise RuntimeError(f"the Lightning reference run failed (exit {code})")
    return _tensors(hf_out / "model.safetensors"), _tensors(lt_out / "final.safetensors")


def _median_range(values: list[float]) -> tuple[float, float, float] | None:
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def _fmt(values: list[float], fmt: str, unit: str = "") -> str:
    stats = _median_range(values)
    if stats is None:
        return "—"
    med, lo, hi = stats
    spread = "" if lo == hi else f" ({fmt.format(lo)}–{fmt.format(hi)})"
    return f"{fmt.format(med)}{unit}{spread}"


def summary(arm: Arm) -> dict[str, Any]:
    """The arm's table cells: medians with their range over the repetitions."""
    ran = [o for o in arm.outcomes if o.ran]
    attempts = (
        _fmt([float(o.attempts) for o in ran], "{:.0f}")
        if len(ran) == len(arm.outcomes)
        else f"no running fit in {len(arm.outcomes) - len(ran)} of {len(arm.outcomes)}"
    )
    distances = [o.distance for o in ran if o.distance is not None]
    return {
        "arm": arm.name,
        "attempts": attempts,
        "wall": _fmt([o.wall_s for o in arm.outcomes], "{:.0f}", " s"),
        "effective_batch": ", ".join(sorted({str(o.effective_batch) for o in ran})) or "—",
        "distance": _fmt(distances, "{:.2g}") if distances else "—",
        "peak": _fmt([o.peak_rss / 2**30 for o in ran if o.peak_rss], "{:.2f}", " GiB"),
        "probes": _fmt([float(o.probes) for o in arm.outcomes], "{:.0f}"),
        "notes": "; ".join(sorted({o.note for o in arm.outcomes if o.note})),
    }


def markdown(arms: list[Arm]) -> str:
    head = "| arm | attempts to a running fit | wall time | effective batch | weight distance | peak RSS |"
    lines = [head, "|---|---|---|---|---|---|"]
    for arm in arms:
        s = summary(arm)
        lines.append(
            f"| {s['arm']} | {s['attempts']} | {s['wall']} | {s['effective_batch']} | "
            f"{s['distance']} | {s['peak']} |"
        )
    return "\n".join(lines)


def run() -> list[dict[str, Any]]:
    from gpuwarden.runners.testing_models import build_example_assets

    work = Path(tempfile.mkdtemp(prefix="bench-own-scripts-"))
    arms = [Arm("gpuwarden"), Arm("HF auto_find_batch_size"), Arm("Lightning scale_batch_size")]
    plain: list[Uninterrupted] = []
    by_hand: list[ByHand] = []
    beside: list[float] = []
    starts: dict[tuple[str, int], list[Outcome]] = {(r, t): [] for t in (2, 1) for r in ("warm", "cold")}
    daemon: Daemon | None = None
    try:
        assets = work / "assets"
        build_example_assets(assets)
        hf_reference, lightning_reference = _references(assets, work)
        daemon = Daemon(work / "daemon")
        for n in range(REPEATS):  # interleaved, so load changes touch every arm alike
            plain.append(_uninterrupted(assets, work, n))
            by_hand.append(_by_hand(assets, work, n, hf_reference))
            beside.append(_beside_help(assets, work, n))
            arms[0].outcomes.append(_gpuwarden(daemon, assets, work, n, hf_reference))
            for threads in (2, 1):
                for restart in ("warm", "cold"):
                    starts[(restart, threads)].append(
                        _gpuwarden(daemon, assets, work, n, hf_reference, restart=restart, threads=threads)
                    )
            arms[1].outcomes.append(_auto_find(assets, work, n, hf_reference))
            arms[2].outcomes.append(_lightning(assets, work, n, lightning_reference))
            print(f"  repetition {n + 1}/{REPEATS} done", file=sys.stderr, flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(markdown(arms), file=sys.stderr, flush=True)
    warm = [warm_row(starts[("warm", t)], starts[("cold", t)], t) for t in (2, 1)]
    return [*_rows(arms), *overhead_rows(arms, plain, by_hand, beside), *warm]


def _rows(arms: list[Arm]) -> list[dict[str, Any]]:
    ours, *others = arms
    best_other = min(
        (statistics.median(o.attempts for o in a.outcomes) for a in others if all(o.ran for o in a.outcomes)),
        default=math.inf,
    )
    ours_attempts = statistics.median(o.attempts for o in ours.outcomes)
    kept = all(o.ran and o.effective_batch == MICRO for o in ours.outcomes)
    matched = all(o.distance is not None and o.distance < SAME_WEIGHTS for o in ours.outcomes)
    rows: list[dict[str, Any]] = []
    for arm in arms:
        s = summary(arm)
        rows.append(
            {
                "benchmark": f"own script OOM (HF example, {LIMIT} limit, {REPEATS}×): {arm.name}",
                "value": s["attempts"],
                "unit": (
                    f"attempts; wall {s['wall']}; effective batch {s['effective_batch']} (of {MICRO}); "
                    f"weight distance {s['distance']}; peak RSS {s['peak']}; probes {s['probes']}"
                    + (f"; {s['notes']}" if s["notes"] else "")
                ),
                "target": "" if arm is not ours else "batch kept, same weights, ≤ best finder's attempts",
                "ok": None if arm is not ours else (kept and matched and ours_attempts <= best_other),
            }
        )
    return rows


def overhead_rows(
    arms: list[Arm], plain: list[Uninterrupted], by_hand: list[ByHand], beside: list[float]
) -> list[dict[str, Any]]:
    """gpuwarden's recovery overhead (its wall minus the uninterrupted run's, per repetition)
    against one start-up of the script plus 10 % and against a restart by hand, and its wall
    against HF's finder's."""
    ours, hf = arms[0], arms[1]
    overhead = [o.wall_s - u.wall_s for o, u in zip(ours.outcomes, plain, strict=True)]
    by_hand_overhead = [b.wall_s - u.wall_s for b, u in zip(by_hand, plain, strict=True)]
    added = [ours_s - hand_s for ours_s, hand_s in zip(overhead, by_hand_overhead, strict=True)]
    submit = [o.submit_s for o in ours.outcomes if o.submit_s is not None]
    recovery = [o.recovery_s for o in ours.outcomes if o.recovery_s is not None]
    startup = [u.startup_s for u in plain]
    bound = 1.1 * statistics.median(startup)
    ratio = [o.wall_s / h.wall_s for o, h in zip(ours.outcomes, hf.outcomes, strict=True) if h.wall_s > 0]
    hand_distance = [b.distance for b in by_hand if b.distance is not None]
    help_cost = [b - u.wall_s for b, u in zip(beside, plain, strict=True)]
    return [
        {
            "benchmark": "own script OOM: gpuwarden's recovery overhead (its wall − the uninterrupted run's)",
            "value": _fmt(overhead, "{:.1f}", " s"),
            "unit": (
                f"one start-up of the script {_fmt(startup, '{:.1f}', ' s')}; "
                f"uninterrupted wall {_fmt([u.wall_s for u in plain], '{:.1f}', ' s')}; of it: "
                f"submit to attempt 1 {_fmt(submit, '{:.1f}', ' s')}, "
                f"OOM to the restart's first step {_fmt(recovery, '{:.1f}', ' s')}"
            ),
            "target": f"≤ one start-up + 10 % ({bound:.1f} s)",
            "ok": statistics.median(overhead) <= bound,
        },
        {
            "benchmark": "own script OOM: one restart by hand (the failed run, at once its restart at 8 × 2)",
            "value": _fmt(by_hand_overhead, "{:.1f}", " s"),
            "unit": (
                f"overhead (the two runs' wall − the uninterrupted run's); weight distance "
                f"{_fmt(hand_distance, '{:.2g}')}; gpuwarden adds {_fmt(added, '{:.1f}', ' s')} to it, "
                f"of which the script's --help read beside attempt 1 {_fmt(help_cost, '{:.1f}', ' s')} "
                "(the uninterrupted run beside it − alone)"
            ),
            "target": "",
            "ok": None,
        },
        {
            "benchmark": "own script OOM: gpuwarden's wall / HF auto_find_batch_size's",
            "value": _fmt(ratio, "{:.2f}", "×"),
            "unit": "same repetition, side by side",
            "target": "",
            "ok": None,
        },
    ]


def warm_row(warm: list[Outcome], cold: list[Outcome], threads: int) -> dict[str, Any]:
    """The same recovery with the restart forced warm (`--warm-restart`: a standby imported the
    script's libraries while attempt 1 ran) and cold (`--cold-restart`), side by side."""
    saved = [c.wall_s - w.wall_s for w, c in zip(warm, cold, strict=True)]
    warm_recovery = _fmt([o.recovery_s for o in warm if o.recovery_s is not None], "{:.1f}", " s")
    cold_recovery = _fmt([o.recovery_s for o in cold if o.recovery_s is not None], "{:.1f}", " s")
    kept = sum(o.ran and o.effective_batch == MICRO for o in [*warm, *cold])
    same = all(o.distance is not None and o.distance < SAME_WEIGHTS for o in [*warm, *cold])
    spare = "both cores train" if threads == 2 else "one core left free, as on a GPU machine"
    return {
        "benchmark": f"own script OOM, OMP_NUM_THREADS={threads} ({spare}): restart warm against cold",
        "value": _fmt(saved, "{:.1f}", " s"),
        "unit": (
            f"of gpuwarden's wall saved warm; wall warm {_fmt([o.wall_s for o in warm], '{:.1f}', ' s')}, "
            f"cold {_fmt([o.wall_s for o in cold], '{:.1f}', ' s')}; OOM to the restart's first step warm "
            f"{warm_recovery}, cold {cold_recovery}; {kept}/{len(warm) + len(cold)} kept the batch, "
            f"weights {'as' if same else 'NOT as'} uninterrupted"
        ),
        "target": "",
        "ok": None,
    }


if __name__ == "__main__":
    for row in run():
        print(row)
