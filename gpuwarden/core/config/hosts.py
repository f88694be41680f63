"""The `hosts:` list and the `ssh:` section: other machines whose daemons the CLI and the
dashboard reach through the user's own OpenSSH (nothing listens on the network)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from gpuwarden.core.config.validation import StrictModel
from gpuwarden.core.errors import UserError

# What names the local daemon in a host list (reached on its socket, no ssh).
LOCAL_NAMES = frozenset({"local", "localhost"})
# `ssh` reads a word starting with "-" as an option, and a space would split it: a host as ssh
# takes it (`user@host`, `host`, an alias of ~/.ssh/config, `[::1]`) never has either.
_HOST_WORD = re.compile(r"[A-Za-z0-9_.@:\[\]%+][A-Za-z0-9_.@:\[\]%+-]*")


def host_name(text: str) -> str:
    """`text` as a host name, or ValueError saying what a host name looks like."""
    name = text.strip()
    if not _HOST_WORD.fullmatch(name) or len(name) > 255:
        raise ValueError(
            f"{text!r} is not a host: give it as ssh takes it (gpu1, alice@gpu1, an alias of "
            "~/.ssh/config), or `local` for this machine"
        )
    return name


HostName = Annotated[str, AfterValidator(host_name)]


def host_list(words: tuple[str, ...] | list[str]) -> list[str]:
    """Hosts given as repeated options and comma lists (`-H a,b -H c`), in order, once each."""
    names: list[str] = []
    for word in words:
        for part in word.split(","):
            if not part.strip():
                continue
            try:
                name = host_name(part)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            if name not in names:
                names.append(name)
    return names


class SshSettings(StrictModel):
    """How other hosts are reached: the user's `ssh` with its own config, keys and agent."""

    command: str = Field("ssh", min_length=1, description="the ssh program (a name on PATH or a path)")
    config: Path | None = Field(None, description="an ssh config file to use instead of ~/.ssh/config (-F)")
    options: list[str] = Field(
        default_factory=list, description="more ssh options, e.g. ['-o', 'ProxyJump=bastion']"
    )
    connect_timeout_s: float = Field(5.0, gt=0, le=120, description="seconds to connect and log in")
    read_timeout_s: float = Field(10.0, gt=0, le=600, description="seconds a host's daemon may answer in")
    gpuwarden: str = Field(
        "gpuwarden",
        min_length=1,
        description="the gpuwarden command on the hosts (a path when it is not on the PATH ssh gives)",
    )
