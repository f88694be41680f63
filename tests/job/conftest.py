"""The daemon tests' environment (private XDG folders, two fake H100s) for jobs, with or without
a daemon beside them."""

from tests.daemon.conftest import daemon_factory, short_tmp

__all__ = ["daemon_factory", "short_tmp"]
