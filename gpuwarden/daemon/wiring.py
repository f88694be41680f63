"""The one place a supervisor is built: its backends on this machine and the product's policies.

The daemon builds one over its store and live stream; `gpuwarden exec` builds one over a run
folder's store and its own output. Both get the same OOM recovery, autotuning, memory-tier
profile, restart policy and hang watchdog, because both come from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.oom.classify import read_oom_kill_count
from gpuwarden.core.paths import Paths
from gpuwarden.core.run_state import RunState
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import LocalProcesses
from gpuwarden.daemon.sampling import Sampling
from gpuwarden.daemon.supervise import Backends, Hooks, RetuneHook, Supervisor
from gpuwarden.daemon.supervise.backends import OtherMachines
from gpuwarden.daemon.supervise.ports import Publisher, Store
from gpuwarden.daemon.warm_start import LocalWarmStarts


def build_supervisor(
    settings: Settings,
    paths: Paths,
    store: Store,
    publisher: Publisher,
    sampling: Sampling,
    retune_hook: RetuneHook | None = None,
    machines: OtherMachines | None = None,
    user_umask: int | None = None,
) -> Supervisor:
    """A supervisor on this machine's processes and `sampling`'s GPUs, writing to `store` and
    telling `publisher`; `retune_hook` replaces OOM recovery by the run's policy (tests only);
    `machines`: the others a run over several machines also runs on (a job's first node);
    `user_umask`: the umask users' own programs get (None: this process's)."""
    backends = replace(
        local_backends(sampling.gpu_states, sampling.gpu_topology), machines=machines, user_umask=user_umask
    )
    hooks = _hooks(settings, paths, store, sampling, retune_hook)
    return Supervisor(settings, paths, store, publisher, backends, hooks, energy=sampling)


def _hooks(
    settings: Settings, paths: Paths, store: Store, sampling: Sampling, retune_hook: RetuneHook | None
) -> Hooks:
    """The supervisor's decisions: OOM recovery by the run's policy, autotuning and the
    memory-tier profile."""
    from gpuwarden.daemon.autotune import Autotuner, apply_profile

    def environment_of(run_id: str) -> dict[str, str] | None:
        """The environment the run was submitted with, for its probes (on their threads)."""
        return store.call(lambda db: RunStore(db).environment(run_id))

    def no_longer_retuning(run_id: str) -> bool:
        """Whether a run whose retune is probing was stopped or removed meanwhile."""
        run = store.call(lambda db: RunStore(db).get_run(run_id))
        return run is None or run["state"] != RunState.RETUNING

    if retune_hook is None:
        from gpuwarden.core.tune.memory_points import MemoryPoints
        from gpuwarden.daemon.oom_retune import OomRetune

        retune_hook = OomRetune(
            gpu_states=sampling.gpu_states,
            gpu_processes=lambda: sampling.latest_processes,
            retunes_of=lambda run_id: store.call(lambda db: RunStore(db).retunes(run_id)),
            environment_of=environment_of,
            stopped=no_longer_retuning,
            memory_points=MemoryPoints(paths.tune_cache / "memory"),
        )
    autotune = Autotuner(
        sampling.gpu_statics,
        paths.tune_cache,
        power_limit_command=settings.power_limit_command,
        environment_of=environment_of,
    )
    return Hooks(
        retune=retune_hook,
        autotune=autotune,
        profile=lambda spec: apply_profile(spec, sampling.gpu_statics()),
    )


def local_backends(
    gpu_states: Callable[[], list[GpuState]], topology: Callable[[], GpuTopology] = lambda: NO_TOPOLOGY
) -> Backends:
    """The supervisor's backends on this machine: real processes, the wall clock, this cgroup's
    OOM-kill counter, the host's memory, the GPUs' state and links (NVML's topology), standbys
    for users' scripts' restarts."""
    return Backends(
        processes=LocalProcesses(),
        gpu_states=gpu_states,
        clock=time.time,
        oom_kills=read_oom_kill_count,
        host_memory=lambda: int(psutil.virtual_memory().total),
        topology=topology,
        warm=LocalWarmStarts(),
    )
