"""Client of the daemon's API, shared by the CLI and the dashboard (no printing, no click here)."""

from gpuwarden.client.api import API_MAJOR, NOT_RUNNING, ApiClient, default_socket
from gpuwarden.client.sse import StreamFrame

__all__ = ["API_MAJOR", "NOT_RUNNING", "ApiClient", "StreamFrame", "default_socket"]
