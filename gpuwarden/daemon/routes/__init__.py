"""The API's routers, one per resource; each reaches the daemon through `DaemonView` only."""
