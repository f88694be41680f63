"""`--host` on the CLI through a real sshd: two daemons as two hosts, and hosts that fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.conftest import command_spec, wait_for
from tests.fleet.conftest import World, ssh_processes

pytestmark = pytest.mark.slow


def _finished_run(world: World, host: str, text: str) -> str:
    handle = world.hosts[host]
    run = handle.submit(command_spec(f"hello-{host}", f"print({text!r})", resources={"gpus": 0}))
    handle.wait_state(run["id"])
    return str(run["id"])


def test_ps_show_logs_and_gpus_of_two_hosts(world: World) -> None:
    run1 = _finished_run(world, "h1", "hi from h1")
    run2 = _finished_run(world, "h2", "hi from h2")

    ps = world.cli("ps", "--host", "h1,h2")
    assert ps.returncode == 0, ps.stderr
    lines = ps.stdout.splitlines()
    assert lines[0].startswith("HOST")
    assert any(line.startswith("h1") and run1 in line for line in lines)
    assert any(line.startswith("h2") and run2 in line for line in lines)

    gpus = world.cli("gpus", "-H", "h1", "-H", "h2")
    assert gpus.returncode == 0, gpus.stderr
    rows = gpus.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["h1", "h1", "h2"]
    assert "H100" in rows[0] and "A100" in rows[2]

    doc = json.loads(world.cli("gpus", "--host", "h1,h2", "--json").stdout)
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2"]
    assert [len(h["gpus"]) for h in doc["hosts"]] == [2, 1]

    show = world.cli("show", run2, "--host", "h1,h2")
    assert show.returncode == 0, show.stderr
    assert show.stdout.startswith("host:     h2\n") and "succeeded" in show.stdout
    assert json.loads(world.cli("show", run1, "--host", "h1,h2", "--json").stdout)["host"] == "h1"

    logs = world.cli("logs", run1, "--host", "h2,h1")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "hi from h1\n"

    missing = world.cli("show", "nosuchrun", "--host", "h1,h2")
    assert missing.returncode == 2
    assert missing.stderr.strip() == "gpuwarden: no host has run nosuchrun (h1: not there; h2: not there)"
    assert not ssh_processes(world.sshd), "the CLI left ssh processes behind"
    left = [p.name for p in (world.client_root / "run" / "gpuwarden" / "ssh").iterdir()]
    assert left == ["sockets.json"], "tunnel sockets left behind"
    remembered = json.loads((world.client_root / "run" / "gpuwarden" / "ssh" / "sockets.json").read_text())
    assert remembered == {name: str(handle.socket) for name, handle in world.hosts.items()}


def test_a_host_without_daemon_is_one_line_and_comes_back(world: World) -> None:
    run1 = _finished_run(world, "h1", "still here")
    world.hosts["h2"].stop()
    down = world.cli("ps", "--host", "h1,h2,gone")
    assert down.returncode == 1
    lines = down.stdout.splitlines()
    assert any(line.startswith("h1") and run1 in line for line in lines)
    assert "host h2: no gpuwarden daemon — start it there with `gpuwarden up`" in lines
    assert "host gone: ssh: connection refused (no sshd there?)" in lines
    assert down.stderr == ""
    doc = json.loads(world.cli("ps", "--host", "h1,h2", "--json").stdout)
    assert doc["hosts"][1] == {
        "host": "h2",
        "error": "no gpuwarden daemon — start it there with `gpuwarden up`",
        "code": "not_running",
    }

    world.hosts["h2"].start()
    back = world.cli("gpus", "--host", "h1,h2")
    assert back.returncode == 0, back.stdout
    assert [row.split()[0] for row in back.stdout.splitlines()[1:]] == ["h1", "h1", "h2"]


def test_all_hosts_reads_the_config_list_and_local(world: World) -> None:
    config = Path(world.env["XDG_CONFIG_HOME"]) / "gpuwarden" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("hosts:\n  - h2\n  - local\n")
    ps = world.cli("ps", "--all-hosts")
    assert ps.returncode == 1  # the client machine runs no daemon
    assert "host local: the daemon is not running — start it with `gpuwarden up`" in ps.stdout
    assert ps.stdout.splitlines()[0].startswith("HOST")

    hosts = world.cli("hosts")
    assert hosts.stdout.splitlines()[0].startswith("host h2: gpuwarden ")

    config.write_text("hosts:\n  - h2\n  - -oProxyCommand=touch\n")
    bad = world.cli("ps", "--all-hosts")
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"gpuwarden: {config}:3: hosts[1]: ")
    assert "is not a host" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_refused_key_and_a_missing_gpuwarden_are_one_line_each(world: World) -> None:
    other_key = world.sshd.root / "other_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    with world.sshd.ssh_config.open("a") as f:
        f.write(
            f"Host nokey\n  HostName 127.0.0.1\n  Port {world.sshd.port}\n  IdentityFile {other_key}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
        )
    refused = world.cli("ps", "--host", "nokey")
    assert refused.returncode == 1
    assert refused.stdout.splitlines()[1] == (
        "host nokey: ssh: the key was refused — add it there (ssh-copy-id) or to your ssh-agent"
    )
    env_missing = {**world.env, "GPUWARDEN_SSH__GPUWARDEN": "/nonexistent/gpuwarden"}
    missing = subprocess.run(
        [*world.cli_argv(), "gpus", "--host", "h1"],
        env=env_missing,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1
    assert missing.stdout.splitlines()[1].startswith("host h1: `/nonexistent/gpuwarden` is not found there")


def test_a_fleet_keeps_one_tunnel_per_host_and_reopens_it(world: World) -> None:
    from gpuwarden.client.hosts import Fleet
    from gpuwarden.client.ssh_forward import SshCommand

    remote = world.sshd.client_env()["GPUWARDEN_SSH__GPUWARDEN"]
    ssh = SshCommand(("ssh", "-F", str(world.sshd.ssh_config)), 5.0, 10.0, remote)
    # A socket remembered from an earlier command where no daemon listens now: h1 is asked again.
    (world.client_root / "run" / "ssh").mkdir(mode=0o700)
    remembered = world.client_root / "run" / "ssh" / "sockets.json"
    remembered.write_text(json.dumps({"h1": "/tmp/gone/api.sock"}))
    with Fleet(["h1", "h2"], ssh, world.client_root / "run") as fleet:
        first = fleet.each(lambda c: len(c.gpus().gpus))
        assert [(a.host, a.value) for a in first] == [("h1", 2), ("h2", 1)]
        masters = {p.pid for p in ssh_processes(world.sshd)}
        assert len(masters) == 2
        assert json.loads(remembered.read_text()) == {h: str(d.socket) for h, d in world.hosts.items()}
        fleet.each(lambda c: c.runs())
        assert {p.pid for p in ssh_processes(world.sshd)} == masters  # kept, not opened again

        world.hosts["h2"].stop()
        degraded = fleet.each(lambda c: len(c.gpus().gpus))
        assert degraded[0].value == 2 and degraded[1].code == "not_running"
        world.hosts["h2"].start()

        def both() -> bool:
            return all(a.ok for a in fleet.each(lambda c: len(c.gpus().gpus)))

        wait_for(both, "h2 to answer again through a new tunnel")
    assert not ssh_processes(world.sshd), "closing the fleet must end its ssh processes"
