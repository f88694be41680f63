"""A preset run's script help, read beside its first attempt.

A framework preset appends its resume flag only once the script's `--help` lists it. Reading that
help costs a start of the script (its imports: seconds for a Trainer script), and the flag never
reaches the first attempt (`{resume_from?}` vanishes there), so the help is read on a thread of
its own while the first attempt runs, not in front of it. What it finds is recorded before any
restart starts: a help that does not list the flag takes it out of the run's stored spec, with a
`warning` event saying why; one that cannot be read leaves it in, said unchecked. A retune waits
for it (`wait`), and so does a restart the scheduler would start (`pending`).

While it is read, a file in the run's folder says what to read (`help-pending.json`: the program,
its folder, the flag; the environment is the run's stored one), so a daemon killed meanwhile
reads it again when it starts (`read_again`) instead of leaving the flag on unchecked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from pathlib import Path

from gpuwarden.core.command.help_check import (
    HELP_TIMEOUT_S,
    MISSING_CODE,
    FlagCheck,
    HelpAsk,
    help_env,
    judge_help,
    run_help,
    without_flag,
    without_role,
)
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.private import write_private_text
from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.core.store.runs import RunStore
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.supervise.context import Context, spec_document

log = logging.getLogger("gpuwarden.daemon.supervisor")

# A help is bounded by HELP_TIMEOUT_S; what a waiter allows beyond it for the record to be written.
_WAIT_MARGIN_S = 10.0
PENDING_FILE = "help-pending.json"


def read_later(ctx: Context, run_id: str, run_dir: Path, spec: RunSpec, ask: HelpAsk) -> None:
    """Read the script's help on a thread and record what it says of the flag (`spec`: the run's,
    for its framework)."""
    done = threading.Event()
    ctx.help_pending[run_id] = done
    pending_file = run_dir / PENDING_FILE
    saved = json.dumps({"argv": ask.argv, "cwd": str(ask.cwd), "flag": ask.flag})
    with contextlib.suppress(OSError):  # a folder that refuses it loses only the re-read after a crash
        write_private_text(pending_file, saved)

    def work() -> None:
        try:
            out = run_help(ask.argv, ask.env, ask.cwd, HELP_TIMEOUT_S)
            checked = judge_help(spec, ask, out)
            if checked.lines():
                _record(ctx, run_id, ask, checked, off=checked.code == MISSING_CODE)
            pending_file.unlink(missing_ok=True)
        except Exception as exc:
            log.warning("run %s: the script's help was not recorded: %s", run_id, one_line(exc))
        finally:
            ctx.help_pending.pop(run_id, None)
            done.set()
            ctx.wake()  # a restart held for it may start now

    ctx.backends.start_thread(f"help-{run_id}", work)


def read_again(ctx: Context) -> None:
    """After a daemon restart: read the helps the previous daemon was reading when it died, for
    the runs not yet over."""
    for run in ctx.store(lambda s: s.list_runs(states=(*ACTIVE_STATES, RunState.QUEUED))):
        pending_file = Path(str(run["run_dir"])) / PENDING_FILE
        try:
            saved = json.loads(pending_file.read_text(encoding="utf-8"))
            spec = spec_from_mapping(dict(run["spec"]))
            ask = HelpAsk([str(a) for a in saved["argv"]], {}, Path(saved["cwd"]), str(saved["flag"]))
        except (OSError, ValueError, KeyError, TypeError, UserError):
            continue  # none pending (or unreadable: the flag stays on, as an unread help leaves it)
        run_id = str(run["id"])
        env = help_env(spec, run_environment.base(_environment(ctx, run_id)))  # as its attempts start
        read_later(ctx, run_id, pending_file.parent, spec, HelpAsk(ask.argv, env, ask.cwd, ask.flag))


def _environment(ctx: Context, run_id: str) -> dict[str, str] | None:
    return ctx.store(lambda s: s.environment(run_id))


def _record(ctx: Context, run_id: str, ask: HelpAsk, checked: FlagCheck, *, off: bool) -> None:
    """The warnings, and the flags the script lacks out of the stored spec as it is then (read
    and written in one transaction, so an edit made meanwhile is kept)."""
    if ctx.find(run_id) is None:
        return  # deleted meanwhile
    flag = ask.flag if off else None
    batch = ctx.batch()
    if flag or checked.dropped:
        batch = batch.write(lambda s: _flags_off(s, run_id, flag, checked.dropped))
    for code, message in checked.lines():
        batch = batch.event(run_id, None, "warning", code=code, message=message)
    batch.commit()


def _flags_off(store: RunStore, run_id: str, flag: str | None, dropped: tuple[str, ...]) -> None:
    run = store.get_run(run_id)
    if run is None:
        return
    try:
        spec = spec_from_mapping(dict(run["spec"]))
    except UserError:
        return  # a spec that no longer validates fails in the queue anyway
    if flag:
        spec = without_flag(spec, flag)
    for name in dropped:
        spec = without_role(spec, name)
    store.update_run(run_id, spec=spec_document(spec))


def pending(ctx: Context, run_id: str) -> bool:
    """Whether the run's script help is still being read."""
    return run_id in ctx.help_pending


def wait(ctx: Context, run_id: str) -> None:
    """Until the run's script help is recorded (bounded): off the loop only (a retune's thread)."""
    done = ctx.help_pending.get(run_id)
    if done is not None and not done.wait(HELP_TIMEOUT_S + _WAIT_MARGIN_S):
        log.warning("run %s: its script's help still unread; restarting with the flag unchecked", run_id)
