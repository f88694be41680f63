"""Notifications sent from the daemon: targets (apprise URLs, a command) and their threads."""
