"""The daemon tests' environment (private XDG folders, two fake H100s) for cluster engines' jobs."""

from tests.daemon.conftest import daemon_factory, short_tmp

__all__ = ["daemon_factory", "short_tmp"]
