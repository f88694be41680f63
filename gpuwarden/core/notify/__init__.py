"""Notifications: which events make a message, the message, the rate limit (headless, pure)."""
