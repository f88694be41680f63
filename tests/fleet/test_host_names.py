"""Host lists, the `hosts:`/`ssh:` settings and ssh's failures in one line (no sshd needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.client.hosts import Fleet
from gpuwarden.client.ssh_forward import SshCommand, ssh_failure
from gpuwarden.core.config.hosts import host_list
from gpuwarden.core.config.settings import load_settings
from gpuwarden.core.errors import ConfigError, UserError


def test_hosts_are_repeated_options_and_comma_lists_once_each() -> None:
    assert host_list(("gpu1,alice@gpu2", " gpu1 ", "local,", "[::1]")) == [
        "gpu1",
        "alice@gpu2",
        "local",
        "[::1]",
    ]
    for bad in ("-oProxyCommand=touch /tmp/x", "gpu 1", "a;b"):
        with pytest.raises(UserError, match="is not a host"):
            host_list((bad,))


def test_the_config_lists_hosts_and_says_where_one_is_wrong(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("hosts: [gpu1, local]\nssh:\n  config: ~/.ssh/lab\n  connect_timeout_s: 2\n")
    settings = load_settings(config, environ={})
    assert settings.hosts == ["gpu1", "local"]
    ssh = SshCommand.of(settings.ssh)
    assert ssh.argv == ("ssh", "-F", str(Path("~/.ssh/lab").expanduser())) and ssh.login_deadline_s == 6
    config.write_text("hosts:\n  - gpu1\n  - --help\nssh:\n  conect_timeout_s: 2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    problems = caught.value.problems
    assert any(p.startswith(f"{config}:3: hosts[1]: ") and "is not a host" in p for p in problems)
    assert any(p.startswith(f"{config}:5: ssh.conect_timeout_s: unknown key") for p in problems)


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        ("ssh: connect to host 10.0.0.9 port 22: Connection timed out\r\n", "ssh: connect timed out"),
        (
            "ssh: connect to host gpu3 port 22: Connection refused\n",
            "ssh: connection refused (no sshd there?)",
        ),
        (
            "alice@gpu2: Permission denied (publickey).\n",
            "ssh: the key was refused — add it there (ssh-copy-id) or to your ssh-agent",
        ),
        (
            "ssh: Could not resolve hostname gpu9: Name or service not known\n",
            "ssh: unknown host (neither in DNS nor in your ssh config)",
        ),
        (
            "kex_exchange_identification: read: Connection reset by peer\n",
            "ssh: kex_exchange_identification: read: Connection reset by peer",
        ),
        ("", "ssh: the connection ended"),
    ],
)
def test_what_ssh_says_becomes_one_line(stderr: str, line: str) -> None:
    assert ssh_failure(stderr) == line


def test_no_ssh_program_is_one_line_per_host_and_the_local_daemon_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWARDEN_SOCKET", str(tmp_path / "no-daemon.sock"))
    ssh = SshCommand(("/nonexistent/ssh",), 1.0, 1.0, "gpuwarden")
    with Fleet(["gpu1", "local"], ssh, tmp_path) as fleet:
        answers = fleet.each(lambda client: client.health())
    assert answers[0].error is not None and answers[0].error.startswith("cannot run /nonexistent/ssh (")
    assert answers[0].error.endswith("install the OpenSSH client or set ssh.command to it")
    assert answers[1].code == "not_running"
    assert not list((tmp_path / "ssh").iterdir())
