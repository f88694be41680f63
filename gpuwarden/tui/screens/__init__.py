"""Screens and tab panes of the dashboard."""
