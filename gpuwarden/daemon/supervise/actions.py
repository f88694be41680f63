"""What the API asks of the supervisor: submit, stop, resume, tune, edit, delete.

Each checks the run's state under the lock and refuses with `Conflict` (HTTP 409) what that state
does not allow; the loop does the rest on its next pass (woken at once).
"""

from __future__ import annotations

import copy
import logging
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.command.complete import Submitted, complete_command, complete_submitted
from gpuwarden.core.config.inputs import require_inputs
from gpuwarden.core.config.knob_edit import check_knob_names, merged_knobs
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.policy import relative_policy
from gpuwarden.core.run_ref import new_run_id
from gpuwarden.core.run_state import ACTIVE_STATES, CHANGEABLE_STATES, RESUMABLE_STATES, RunState
from gpuwarden.core.submission import Submission
from gpuwarden.core.tune.command_tune import tune_blocker
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.placement import check_feasible
from gpuwarden.daemon.supervise import help_reader
from gpuwarden.daemon.supervise.context import Batch, Conflict, Context, spec_document
from gpuwarden.daemon.supervise.hooks import ProfileHook

log = logging.getLogger("gpuwarden.daemon.supervisor")


def _check_machines(ctx: Context, spec: RunSpec) -> None:
    """A run over several machines is supervised from inside its cluster job, by the first
    machine's `gpuwarden exec` with the others beside it: not by a daemon."""
    nodes = spec.resources.nodes
    machines = ctx.backends.machines
    if nodes == 1 or (machines is not None and machines.count == nodes):
        return
    if machines is None:
        raise UserError(
            f"resources.nodes is {nodes}: a run over several machines runs inside a cluster job, one "
            f"`gpuwarden exec --nodes {nodes}` on each machine (`gpuwarden slurm submit --nodes {nodes}` "
            "writes that job) — the daemon supervises this machine only; or set resources.nodes: 1",
            code="needs_nodes",
        )
    raise UserError(
        f"resources.nodes is {nodes} and this job has {machines.count} machines (--nodes): make them agree"
    )


def submit(
    ctx: Context,
    spec: RunSpec,
    submitted_text: str | None,
    *,
    label: str,
    check_inputs: bool,
    profile: ProfileHook | None,
    environment: Mapping[str, str] | None = None,
    submission: Submission | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Validate what waiting cannot fix, persist the run as queued (with the submitter's
    environment, when given), and wake the scheduler. A submit sent again with its key answers
    the run the first one queued; one whose client stopped waiting is not queued (`submission`).
    `run_id`: the id, when the host chose it (a job's store lives in the run's folder)."""
    if (earlier := _submitted_before(ctx, submission)) is not None:
        return earlier
    submitted = _completed(spec, environment)
    spec = submitted.spec
    _check_machines(ctx, spec)
    if check_inputs:
        require_inputs(spec, label, "fix the path, or submit with --no-check-inputs when a run creates it")
    check_feasible(spec.resources, ctx.backends.gpu_states())
    profile_line = ""
    if profile is not None:
        profiled, profile_line = profile(spec)
        if profiled is not None:
            spec = spec_from_mapping(profiled)
    run_id = run_id or new_run_id()
    run_dir = ctx.paths.run_dir(run_id)
    document = spec_document(spec)
    text = submitted_text if submitted_text is not None else yaml.safe_dump(document, sort_keys=False)
    kept = run_environment.submitted(environment)
    created = ctx.batch().write(
        lambda s: s.create_run(
            run_id,
            spec.name,
            spec.kind,
            document,
            str(run_dir),
            "waiting to start",
            environment=kept,
            submission=submission,
        )
    )
    if profile_line:
        created.event(run_id, None, "profile", message=profile_line)
    for code, message in submitted.warnings:
        created.event(run_id, None, "warning", code=code, message=message)
    if (earlier := _queue(ctx, created, run_dir, text, submission)) is not None:
        return earlier
    if submitted.help is not None:
        help_reader.read_later(ctx, run_id, run_dir, spec, submitted.help)
    with ctx.lock:
        run = ctx.run(run_id)
        ctx.publish_run(run)
    ctx.wake()
    return run


def _completed(spec: RunSpec, environment: Mapping[str, str] | None) -> Submitted:
    """Command runs: preset knobs, config values, placeholders; the preset's resume flag to be
    asked of the script's help (run as its attempts run: from the submitter's environment),
    beside the first attempt; what would make a restart start from the beginning."""
    env = run_environment.base(run_environment.submitted(environment))
    return complete_submitted(spec, env, defer_help=True)


def _queue(
    ctx: Context, created: Batch, run_dir: Path, text: str, submission: Submission | None
) -> dict[str, Any] | None:
    """Write the run's folder and commit `created`; the run an earlier submit with the same key
    queued instead, if one did (then nothing is written)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "spec.yaml").write_text(text)
        with ctx.lock:
            # Under the lock, as the commit: a twin sent meanwhile with the same key is found,
            # and the deadline is checked last, right before the run exists.
            if (earlier := _submitted_before(ctx, submission)) is not None:
                shutil.rmtree(run_dir, ignore_errors=True)
                return earlier
            if submission is not None and submission.late_by() > 0:
                late = "its submit came after its client stopped waiting"
                log.info("run %s not queued: %s", run_dir.name, late)
                submission.check_in_time()
            created.commit()
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # refused (late, a full disk): no folder of no run
        raise
    return None


def _submitted_before(ctx: Context, submission: Submission | None) -> dict[str, Any] | None:
    """The run an earlier submit with the same key queued (None: there is none, or no key)."""
    if submission is None or submission.key is None:
        return None
    key = submission.key
    earlier = ctx.store(lambda s: s.submitted_as(key))
    if earlier is None:
        return None
    earlier.check_same(submission)
    return ctx.find(earlier.run_id)


def stop(ctx: Context, run_id: str, grace: float | None) -> dict[str, Any]:
    """SIGTERM the run's process group now; the loop SIGKILLs it after the grace period."""
    with ctx.lock:
        run = ctx.run(run_id)
        state = RunState(run["state"])
        if state.final:
            raise Conflict(f"run {run_id} has already ended ({state}): nothing to stop")
        if state is RunState.QUEUED:
            ctx.set_state(run_id, RunState.STOPPED, _stopped_while_queued(ctx, run_id), stop_requested=1)
            return ctx.run(run_id)
        active = ctx.active.get(run_id)
        if active is None:
            ctx.set_state(run_id, RunState.STOPPED, "stopped between attempts", stop_requested=1)
            if state is RunState.RETUNING:
                # Its retune may be probing (a probe holds the GPU for its whole length): the
                # probes carry the run's tag, and the retune starts no other once it is stopped.
                probes = [t for t in ctx.backends.processes.tagged() if t.run_id == run_id]
                ctx.backends.processes.kill(probes)
            return ctx.run(run_id)
        grace = ctx.settings.stop_grace_seconds if grace is None else grace
        kill_at = ctx.clock() + grace
        # The deadline is recorded: a daemon restarted within the grace period keeps it.
        stopping = ctx.batch().write(lambda s: s.update_run(run_id, stop_requested=1))
        stopping.event(run_id, active.attempt, "stopping", grace_seconds=grace, kill_at=kill_at).commit()
        active.stop_requested = True
        active.kill_at = kill_at
        if not active.child.signal_group(signal.SIGTERM):
            active.kill_at = None
        ctx.wake()
        return ctx.run(run_id)


def _stopped_while_queued(ctx: Context, run_id: str) -> str:
    """A queued run either never started or waits for its next attempt (a restart's back-off, a
    retune's restart): say which, so a run that ran is not read as one that never did."""
    ran = len(ctx.store(lambda s: s.attempts(run_id)))
    if not ran:
        return "stopped before it started"
    return f"stopped while waiting to start attempt {ran + 1} (attempt {ran} ran)"


def resume(ctx: Context, run_id: str) -> dict[str, Any]:
    """Queue a new attempt of a run that failed, was stopped or was interrupted."""
    with ctx.lock:
        run = ctx.run(run_id)
        state = RunState(run["state"])
        if state is RunState.SUCCEEDED:
            raise Conflict(
                f"run {run_id} succeeded: nothing to resume — submit a new run "
                f"(`gpuwarden show {run_id} --json` holds its spec)"
            )
        if state not in RESUMABLE_STATES:
            raise Conflict(f"run {run_id} is {state}: only failed, stopped or interrupted runs resume")
        ctx.set_state(run_id, RunState.QUEUED, "resumed", stop_requested=0, ended_at=None)
        ctx.not_before.pop(run_id, None)  # a person's resume starts now
    ctx.wake()
    return ctx.run(run_id)


def tune(ctx: Context, run_id: str) -> dict[str, Any]:
    """Tune the run before its next attempt: a queued run tunes before it starts; a failed,
    stopped or interrupted one is resumed and tuned first (it continues from its checkpoint
    with the tuned micro-batch, the effective batch kept)."""
    with ctx.lock:
        run = ctx.run(run_id)
        state = RunState(run["state"])
        if state not in CHANGEABLE_STATES:
            raise not_changeable(run_id, state, "tune")
        spec = spec_from_mapping(dict(run["spec"]))
        blocker = tune_blocker(complete_command(spec)) if spec.kind == "command" else None
        if blocker is not None:
            raise UserError(f"run {run_id}: {blocker}")
        tuned = spec.model_copy(update={"autotune": True})
        changed = ctx.batch().write(lambda s: s.update_run(run_id, spec=spec_document(tuned)))
        if state is not RunState.QUEUED:
            changed.set_state(run_id, RunState.QUEUED, "resumed to tune", stop_requested=0, ended_at=None)
        changed.commit()
    ctx.wake()
    return ctx.run(run_id)


def not_changeable(run_id: str, state: RunState, verb: str) -> Conflict:
    """Why a run in `state` cannot be tuned or changed, and what to do instead."""
    if state is RunState.SUCCEEDED:
        return Conflict(
            f"run {run_id} succeeded: it is kept as it ran — submit a new run to {verb} "
            f"(`gpuwarden show {run_id} --json` holds its spec)"
        )
    return Conflict(f"run {run_id} is {state}: stop it first, then {verb}")


def edit(ctx: Context, run_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Change a run that is not running: name, knobs, resources, or any spec key by its dotted
    path (`set`); the result is re-validated as a whole spec. A stopped or failed run keeps its
    state: edit it, then resume it."""
    with ctx.lock:
        run = ctx.run(run_id)
        if RunState(run["state"]) not in CHANGEABLE_STATES:
            raise not_changeable(run_id, RunState(run["state"]), "change it")
        spec = complete_command(
            spec_from_mapping(changed(run["spec"], changes), label=f"the edit of run {run_id}")
        )
        if (named := relative_policy(spec.policy)) is not None:
            # A submitted spec's policy path starts from its file's folder; an edit has none.
            raise UserError(
                f"policy: {named} is a relative path, and an edit has no folder it starts from "
                "— give the policy file's absolute path"
            )
        check_feasible(spec.resources, ctx.backends.gpu_states())
        record = edit_record(run["spec"], spec_document(spec), changes)
        if not record:  # an empty request, or values the run already has: no story to tell
            raise UserError(f"nothing to change: run {run_id} already has what the edit asks for")
        # A person's change is part of the run's story: the timeline and `show` list it.
        edited = ctx.batch().write(lambda s: s.update_run(run_id, spec=spec_document(spec), name=spec.name))
        edited.event(run_id, None, "edited", changes=record).commit()
        updated = ctx.run(run_id)
        ctx.publish_run(updated)
        return updated


def delete(ctx: Context, run_id: str) -> None:
    """Forget a run that is not active, and remove its directory. A queued run that never
    started goes as a queued task does in pueue; one that waits for its next attempt (a restart's
    back-off, GPUs after a retune) has progress a removal would take along: stopped first."""
    with ctx.lock:
        run = ctx.run(run_id)
        state = RunState(run["state"])
        waits_to_go_on = state is RunState.QUEUED and bool(ctx.store(lambda s: s.attempts(run_id)))
        if state in ACTIVE_STATES or run_id in ctx.active or waits_to_go_on:
            raise Conflict(f"run {run_id} is {run['state']} — stop it first (`gpuwarden stop {run_id}`)")
        ctx.store(lambda s: s.delete_run(run_id))
        shutil.rmtree(run["run_dir"], ignore_errors=True)


def changed(spec: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the spec document with the given knobs over the run's, whole sections replaced
    and dotted keys (`set`) set. No way of naming knobs adds one the run does not have."""
    document = copy.deepcopy(dict(spec))
    kind, knobs = str(spec.get("kind")), list(spec.get("knobs") or {})
    for key, value in changes.items():
        if key == "set":
            for dotted, new in (value or {}).items():
                _check_section(dotted, kind)
                set_dotted(document, dotted, new)
        elif key == "knobs" and value is not None:
            document["knobs"] = merged_knobs(document.get("knobs") or {}, value, kind)
        elif value is not None:
            document[key] = value
    after = document.get("knobs")
    if isinstance(after, Mapping):  # `set` may have named `knobs.lr` or the section whole
        check_knob_names(list(after), knobs, kind)
    return document


def _check_section(dotted: str, kind: str) -> None:
    """A dotted key into another kind's section (`train.batch_size` on a command run) would only
    surface as that section's missing keys: say what the run has instead. Each kind's own
    settings live in the section named as it is."""
    section = dotted.split(".", 1)[0]
    if section in ("train", "infer", "command") and section != kind:
        where = "knobs (knobs.NAME)" if kind == "command" else f"the {kind} section ({kind}.KEY)"
        raise UserError(f"{dotted}: a {kind} run has no {section} section — its settings are in {where}")


def edit_record(
    before: Mapping[str, Any], after: Mapping[str, Any], changes: Mapping[str, Any]
) -> dict[str, list[Any]]:
    """What an edit changed, key → [before, after]: dotted keys as given, knobs one by one."""
    out: dict[str, list[Any]] = {}
    for key, value in changes.items():
        if key == "set":
            out.update({d: [_dotted(before, d), _dotted(after, d)] for d in value or {}})
        elif key == "knobs" and isinstance(value, Mapping):
            old = before.get("knobs") or {}
            out.update({f"knobs.{k}": [old.get(k), v] for k, v in value.items() if old.get(k) != v})
        elif value is not None:
            out[key] = [before.get(key), after.get(key)]
    return out


def _dotted(document: Mapping[str, Any], dotted: str) -> Any:
    node: Any = document
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def set_dotted(document: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested spec document; unknown keys are caught by re-validation."""
    parts = dotted.split(".")
    if not all(parts):
        raise UserError(f"{dotted!r} is not a spec key path — use e.g. train.batch_size")
    node = document
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
