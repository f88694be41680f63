"""Client of the daemon's API, shared by the CLI and the dashboard (no printing, no click here)."""

import sys

# httpx's package imports its own command-line tool, which loads rich and pygments when they are
# installed (the dashboard installs rich): a third of httpx's import time, paid by every
# `gpuwarden ps`, for a tool this client never runs. Blocked while httpx loads (it then defines
# a stand-in `httpx.main`), and unblocked at once, so nothing else in the process is affected.
if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
    sys.modules["httpx._main"] = None  # type: ignore[assignment]
    try:
        import httpx  # noqa: F401
    finally:
        del sys.modules["httpx._main"]

from gpuwarden.client.api import API_MAJOR, NOT_RUNNING, ApiClient, default_socket
from gpuwarden.client.sse import StreamFrame

__all__ = ["API_MAJOR", "NOT_RUNNING", "ApiClient", "StreamFrame", "default_socket"]
