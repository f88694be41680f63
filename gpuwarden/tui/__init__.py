"""The Textual dashboard: a client of the daemon's API only."""
